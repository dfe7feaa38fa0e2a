"""`python -m jobs.serve JOB_DIR [JOB_DIR ...] [--host H] [--port P] [--api-key KEY]` (cli.py)."""
from jobs.serve.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
