"""`python -m jobs.train CONFIG.yaml [--key value ...] [--dry-run] [--data-dir DIR]`: see jobs/train/cli.py."""
import sys

from jobs.train.cli import main, whole_lines

if __name__ == "__main__":   # importing the module (a tool's import scan) must not start a job
    whole_lines()   # torchrun's ranks share one log: a line is one write
    sys.exit(main())
