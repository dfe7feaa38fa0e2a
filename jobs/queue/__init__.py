"""The queue: the SQLite job store, the runner that claims jobs, places them on GPUs and starts each as its own
process (`python -m jobs.train`), cancels and re-attaches, and the process helpers.

May import jobs.spec, jobs.io and jobs.launch; never jobs.train (a job is a subprocess, not a call)."""
