#!/usr/bin/env bash
# Set up (if needed: only what the demo needs) and run the demo: constrained output from the embedded Gemma 3 270M.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh demo
exec .venv/bin/python -m constrain.cli demo "$@"
