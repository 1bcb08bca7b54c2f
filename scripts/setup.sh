#!/usr/bin/env bash
# Create .venv and install constrain with everything its demo and tests need. Idempotent: a second run with an
# unchanged pyproject.toml returns at once.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
stamp=.venv/.constrain-installed
want=$(sha256sum pyproject.toml scripts/setup.sh | sha256sum | cut -c1-16)
if [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$want" ]; then
  exit 0
fi
.venv/bin/python -m pip install -q --upgrade pip
# The pinned CPU build of torch first: an unpinned torch would pull a CUDA build of several GB.
.venv/bin/python -m pip install -q "torch==2.13.0"
.venv/bin/python -m pip install -q -e ".[test,bench]"
echo "$want" > "$stamp"
