"""Plumbing every floor above uses: the data dir, private and atomic writes and disk errors, one job folder's
layout, the events file (writer and the one reader), telemetry, the log tee, the GPU inventory and placement rules.

May import jobs.spec only."""
