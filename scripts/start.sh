#!/usr/bin/env bash
# Set up (first run only takes minutes) and launch the studio at http://127.0.0.1:7860.
# Extra arguments go to app.py, e.g. --port 8080 --data-dir /data --auth me:secret
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python app.py "$@"
