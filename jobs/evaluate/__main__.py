import sys

from jobs.evaluate.cli import main

sys.exit(main())
