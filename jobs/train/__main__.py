"""`python -m jobs.train CONFIG.yaml [--key value ...] [--dry-run] [--data-dir DIR]`: see jobs/train/cli.py."""
import sys

from jobs.train.cli import main

sys.exit(main())
