#!/usr/bin/env bash
# Set up (with test tools and chromium) and run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
exec .venv/bin/python -m pytest -q -ra --durations=30 "$@" tests
