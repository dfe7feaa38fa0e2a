"""Fusetune's jobs: everything between a JobSpec and a trained adapter, in floors that import downwards only.

errors.py and messages.py (the sentences written for people, by name) < spec.py (the contract) < io/
(plumbing) < models/ and launch.py < data/ < checks/ and export/ < train/ and queue/ (which never import
each other). tests/test_layout.py holds the floors."""
