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
.venv/bin/python -m pip install -q -e ".[test,bench,llamacpp]"
# A wheel cached from a -march=native build would crash the test run: check that llama.cpp can evaluate a token,
# and rebuild it once (replacing the cached wheel) if it cannot.
llama_runs() {
  .venv/bin/python - >/dev/null 2>&1 <<'PY'
import llama_cpp
from constrain.models import gguf_model_path
llm = llama_cpp.Llama(model_path=str(gguf_model_path()), n_ctx=64, n_threads=1, verbose=False)
llm.eval(llm.tokenize(b"ok"))
PY
}
if ! llama_runs; then
  echo "setup: the installed llama-cpp-python crashes on this CPU; rebuilding it with CMAKE_ARGS=${CMAKE_ARGS:-}" >&2
  .venv/bin/python -m pip cache remove "llama_cpp_python*" >/dev/null 2>&1 || true
  .venv/bin/python -m pip install -q --force-reinstall --no-deps "llama-cpp-python>=0.3"
  llama_runs || { echo "setup: llama-cpp-python still cannot evaluate a token on this machine" >&2; exit 1; }
fi
# Compile numba's determinisation kernels into its on-disk cache now (about a minute): those only a large automaton
# reaches would otherwise be compiled in the middle of the first such compile.
.venv/bin/python -c "from constrain.automaton import compile_kernels; compile_kernels()"
echo "$want" > "$stamp"
