#!/usr/bin/env bash
# Set up (if needed) and run the demo: constrained output on the real Gemma 3 tokenizer.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
exec .venv/bin/python -m constrain.cli demo "$@"
