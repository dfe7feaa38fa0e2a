#!/usr/bin/env bash
# Set up (with test tools and chromium) and run the whole test suite on CPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh --dev
# two workers of one CPU thread each, browser tests on one, the heaviest modules first (tests/suite_plan.py)
exec .venv/bin/python -m pytest -q -ra --durations=25 -n "${FUSETUNE_TEST_WORKERS:-2}" --dist loadgroup \
  --no-loadscope-reorder "$@" tests
