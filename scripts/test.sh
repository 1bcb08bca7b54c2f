#!/usr/bin/env bash
# Set up (if needed: the demo's packages plus the tests', llama-cpp-python and vLLM's modules) and run the test
# suite. Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh test
exec .venv/bin/python -m pytest -q "$@"
