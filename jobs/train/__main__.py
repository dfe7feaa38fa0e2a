"""`python -m jobs.train CONFIG.yaml [--key value ...] [--dry-run] [--data-dir DIR]`: see jobs/train/cli.py."""
import sys

from jobs.train.cli import main

if __name__ == "__main__":   # importing the module (a tool's import scan) must not start a job
    sys.exit(main())
