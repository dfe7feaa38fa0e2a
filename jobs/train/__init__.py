"""Training: the `python -m jobs.train` entry (cli.py), the one shared loop (loop.py) and the methods beside it
(methods/: each a loss, its batches and the metrics it logs), evaluation, checkpoints, data parallel, step graphs.

May import every floor below (checks, export, data, models, io, spec, launch, kernels); never jobs.queue."""
