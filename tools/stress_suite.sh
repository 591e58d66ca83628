#!/usr/bin/env bash
# Runs the whole test suite N times (default 5) while busy loops compete for every core, to
# shake out tests that pass only on an idle machine (timeouts, races, ordering).
#
#   tools/stress_suite.sh            # 5 runs of the whole suite
#   tools/stress_suite.sh 2          # 2 runs
#   PYTEST_ARGS="tests/test_soak.py -k catches" tools/stress_suite.sh 1   # a subset
#
# Uses the project's virtual environment ($VENV, default .venv, as `make test` creates it),
# and runs the suite as `make test` does: in $TEST_WORKERS processes (default 2), a file each.
# Prints PASS/FAIL per run (with the failing tests) and a tally; exits 1 if any run failed.
# Each run's full pytest output is kept in $LOG_DIR (default: a new directory under /tmp).
set -uo pipefail
cd "$(dirname "$0")/.."

RUNS=${1:-5}
VENV=${VENV:-.venv}
PY="$VENV/bin/python"
read -r -a ARGS <<<"${PYTEST_ARGS:-}"
CORES=$(nproc)
WORKERS=${TEST_WORKERS:-2}

if ! [[ "$RUNS" =~ ^[1-9][0-9]*$ ]]; then
    echo "usage: $0 [RUNS]  (RUNS a positive integer, got '$RUNS')" >&2
    exit 2
fi
if [ ! -x "$PY" ]; then
    echo "$PY not found: run 'make test' first (it creates $VENV), or set VENV=..." >&2
    exit 2
fi
LOG_DIR=${LOG_DIR:-$(mktemp -d /tmp/stress_suite.XXXXXX)}
mkdir -p "$LOG_DIR"

LOAD_PIDS=()
TEST_PID=
stop_all() {
    for pid in $TEST_PID "${LOAD_PIDS[@]}"; do
        kill "$pid" 2>/dev/null
    done
    for pid in $TEST_PID "${LOAD_PIDS[@]}"; do
        wait "$pid" 2>/dev/null
    done
    LOAD_PIDS=()
    TEST_PID=
}
trap stop_all EXIT
trap 'exit 130' INT TERM

# One pure-Python busy loop per core, at the tests' own priority.
for _ in $(seq "$CORES"); do
    "$PY" -c 'while True: pass' &
    LOAD_PIDS+=($!)
done
echo "competing load: $CORES busy loops (pids ${LOAD_PIDS[*]}); logs in $LOG_DIR"

passed=0
failed=0
for run in $(seq "$RUNS"); do
    log="$LOG_DIR/run-$run.log"
    start=$SECONDS
    # In the background and waited for, so that an interrupt stops it and the load at once.
    "$PY" -m pytest -q -p no:cacheprovider -n "$WORKERS" --dist loadfile --no-loadscope-reorder "${ARGS[@]}" >"$log" 2>&1 &
    TEST_PID=$!
    wait "$TEST_PID"
    status=$?
    TEST_PID=
    summary=$(tail -n 1 "$log")
    if [ "$status" -eq 0 ]; then
        passed=$((passed + 1))
        echo "run $run/$RUNS: PASS in $((SECONDS - start)) s ($summary)"
    else
        failed=$((failed + 1))
        echo "run $run/$RUNS: FAIL (exit $status) in $((SECONDS - start)) s ($summary)"
        grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
    fi
done

echo "tally: $passed of $RUNS runs passed, $failed failed (logs in $LOG_DIR)"
[ "$failed" -eq 0 ]
