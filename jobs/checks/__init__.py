"""Checks before a job starts: the preflight (`--dry-run`, the studio's Start) and the read policy (which
paths a studio user may name).

May read jobs.data and jobs.models; never jobs.train or jobs.queue."""
