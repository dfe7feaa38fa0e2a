#!/usr/bin/env bash
# Create .venv and install Fusetune's pinned requirements (idempotent). `--dev` adds test tools
# and Debian's chromium for the browser tests.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3.11}
command -v "$PY" >/dev/null || PY=python3
say() { echo "[setup $(date +%H:%M:%S)] $*"; }   # a newcomer sees what the minutes go to
if [ ! -x .venv/bin/python ]; then
  say "creating .venv with $("$PY" --version 2>&1)"
  "$PY" -m venv .venv
  FIRST=1
fi
say "installing the pinned requirements into .venv${FIRST:+ (first run: about 2.8 GB with PyTorch, a few minutes)}"
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -r requirements.txt
.venv/bin/python -m pip install -q --no-deps -r requirements-builtin.txt
say "requirements ready"
if [ "${1:-}" = "--dev" ]; then
  .venv/bin/python -m pip install -q -r requirements-dev.txt
  # Ray, the optional cluster backend, for the cluster tests (tests/jobs/train/test_ray_cluster.py)
  .venv/bin/python -m pip install -q -r requirements-cluster.txt
  # chromium for the browser tests, and a CJK font so that they (and their screenshots) show Chinese
  if [ ! -x /usr/bin/chromium ] || ! fc-list :lang=zh 2>/dev/null | grep -q .; then
    SUDO=""; [ "$(id -u)" = 0 ] || SUDO="sudo"
    $SUDO apt-get update -q
    DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q chromium fonts-dejavu-core fonts-noto-cjk
  fi
fi
