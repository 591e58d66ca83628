#!/usr/bin/env bash
# Get, start and stop the Beam runners that beam_jax is tested on, from their published
# artifacts, at the version of the installed Beam Python SDK.
#
#   tools/runners.sh fetch [prism|flink|spark|all]   # default: prism
#   tools/runners.sh path prism                      # the prism binary (fetches it first)
#   tools/runners.sh start prism [PORT]              # job service on localhost:PORT (8073)
#   tools/runners.sh stop prism
#   tools/runners.sh status
#
# Prism is a command of Beam's Go module: `go install` builds it at the SDK's version into
# .runners/prism-vX.Y.Z/ (Go caches the module download). The Flink and Spark job servers
# are jars on Maven Central; `mvn dependency:copy` fetches them into .runners/ (Maven
# caches them under ~/.m2). Logs and pid files are kept in .runners/ too.
#
# Environment: PYTHON (the interpreter whose apache_beam sets the version; .venv/bin/python
# by default), BEAM_VERSION (overrides it), FLINK_VERSION (the Flink of the Flink job
# server, 1.19 by default), RUNNERS_DIR (.runners by default).
set -euo pipefail

ROOT="$(cd "$(dirname "$0")/.." && pwd)"
RUNNERS_DIR="${RUNNERS_DIR:-$ROOT/.runners}"
PYTHON="${PYTHON:-$ROOT/.venv/bin/python}"
FLINK_VERSION="${FLINK_VERSION:-1.19}"
START_TIMEOUT_S="${START_TIMEOUT_S:-120}"

die() {
    echo "runners.sh: $*" >&2
    exit 1
}

beam_version() {
    if [[ -n "${BEAM_VERSION:-}" ]]; then
        echo "$BEAM_VERSION"
        return
    fi
    "$PYTHON" -c 'import apache_beam; print(apache_beam.__version__)' 2>/dev/null \
        || die "cannot read the Beam SDK version from $PYTHON; set PYTHON or BEAM_VERSION"
}

prism_bin() {
    echo "$RUNNERS_DIR/prism-v$(beam_version)/prism"
}

fetch_prism() {
    local version bin
    version="$(beam_version)"
    bin="$(prism_bin)"
    if [[ -x "$bin" ]]; then
        return
    fi
    command -v go >/dev/null || die "prism is built with Go (1.23 or newer); 'go' is not on PATH"
    echo "runners.sh: building prism v$version (go install; a few minutes the first time)" >&2
    mkdir -p "$(dirname "$bin")"
    # A temporary GOBIN, then a rename: a build cut short leaves no half-written binary.
    local tmp
    tmp="$(mktemp -d "$RUNNERS_DIR/.prism-build.XXXXXX")"
    if ! GOBIN="$tmp" GOFLAGS=-mod=mod go install \
        "github.com/apache/beam/sdks/v2/go/cmd/prism@v$version" >&2; then
        rm -rf "$tmp"
        die "go install github.com/apache/beam/sdks/v2/go/cmd/prism@v$version failed"
    fi
    mv "$tmp/prism" "$bin"
    rm -rf "$tmp"
}

# fetch_jar ARTIFACT_ID: org.apache.beam:ARTIFACT_ID:<beam version> into .runners/.
fetch_jar() {
    local artifact="org.apache.beam:$1:$(beam_version)"
    local jar="$RUNNERS_DIR/$1-$(beam_version).jar"
    if [[ -f "$jar" ]]; then
        echo "$jar"
        return
    fi
    command -v mvn >/dev/null || die "the job-server jars are fetched with Maven; 'mvn' is not on PATH"
    mkdir -p "$RUNNERS_DIR"
    if ! mvn -B -q dependency:copy -Dartifact="$artifact" -DoutputDirectory="$RUNNERS_DIR" >&2; then
        die "Maven could not fetch $artifact (jar); see the error above"
    fi
    echo "$jar"
}

fetch() {
    case "${1:-prism}" in
        prism) fetch_prism ;;
        flink) fetch_jar "beam-runners-flink-$FLINK_VERSION-job-server" >/dev/null ;;
        spark) fetch_jar "beam-runners-spark-3-job-server" >/dev/null ;;
        all)
            fetch prism
            fetch flink
            fetch spark
            ;;
        *) die "fetch: unknown runner '$1'; expected prism, flink, spark or all" ;;
    esac
}

port_open() {
    (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

start_prism() {
    local port="${1:-8073}" pid_file="$RUNNERS_DIR/prism.pid" log="$RUNNERS_DIR/prism.log"
    fetch_prism
    if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
        die "prism is already running (pid $(cat "$pid_file")); 'tools/runners.sh stop prism' first"
    fi
    port_open "$port" && die "port $port is taken; pass another: tools/runners.sh start prism PORT"
    # setsid: prism and the SDK workers it may start form one process group, stopped together.
    setsid "$(prism_bin)" --job_port="$port" --serve_http=false --log_kind=text \
        >"$log" 2>&1 </dev/null &
    echo $! >"$pid_file"
    local waited=0
    until port_open "$port"; do
        if ! kill -0 "$(cat "$pid_file")" 2>/dev/null; then
            rm -f "$pid_file"
            die "prism exited before listening on port $port; its log ($log):
$(tail -20 "$log")"
        fi
        ((waited++ < START_TIMEOUT_S * 5)) || {
            stop_prism
            die "prism did not listen on port $port within ${START_TIMEOUT_S}s"
        }
        sleep 0.2
    done
    echo "prism job service: localhost:$port (pid $(cat "$pid_file"), log $log)"
    echo "submit with: --runner=PortableRunner --job_endpoint=localhost:$port --environment_type=LOOPBACK"
}

stop_prism() {
    local pid_file="$RUNNERS_DIR/prism.pid"
    [[ -f "$pid_file" ]] || return 0
    local pid
    pid="$(cat "$pid_file")"
    if kill -0 "$pid" 2>/dev/null; then
        kill -TERM -- "-$pid" 2>/dev/null || true
        for _ in $(seq 50); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL -- "-$pid" 2>/dev/null || true
    fi
    rm -f "$pid_file"
}

status() {
    local version
    version="$(beam_version)"
    echo "Beam SDK: $version"
    if [[ -x "$(prism_bin)" ]]; then echo "prism: $(prism_bin)"; else echo "prism: not built"; fi
    local pid_file="$RUNNERS_DIR/prism.pid"
    if [[ -f "$pid_file" ]] && kill -0 "$(cat "$pid_file")" 2>/dev/null; then
        echo "prism: running (pid $(cat "$pid_file"))"
    fi
    for a in "beam-runners-flink-$FLINK_VERSION-job-server" beam-runners-spark-3-job-server; do
        if [[ -f "$RUNNERS_DIR/$a-$version.jar" ]]; then echo "$a: $RUNNERS_DIR/$a-$version.jar"; else echo "$a: not fetched"; fi
    done
}

main() {
    local cmd="${1:-}"
    shift || true
    case "$cmd" in
        fetch) fetch "$@" ;;
        path)
            [[ "${1:-}" == prism ]] || die "path: only 'prism' has a binary"
            fetch_prism
            prism_bin
            ;;
        start)
            [[ "${1:-}" == prism ]] || die "start: only 'prism' can be started (see docs/runners.md)"
            shift
            start_prism "$@"
            ;;
        stop)
            [[ "${1:-}" == prism ]] || die "stop: only 'prism' can be stopped"
            stop_prism
            ;;
        status) status ;;
        *) die "usage: tools/runners.sh fetch [prism|flink|spark|all] | path prism | start prism [PORT] | stop prism | status" ;;
    esac
}

main "$@"
