#!/usr/bin/env bash
# Start / stop a Dask scheduler and workers on this machine with the `dask` CLI,
# for `dkernel fit --scheduler ADDRESS`.  See deploy/README.md.
#
#   deploy/local-cluster.sh start [options]   scheduler + workers; waits until all workers are registered
#   deploy/local-cluster.sh stop  [--dir D]   SIGTERM both process groups, SIGKILL after a grace period
#   deploy/local-cluster.sh status [--dir D]  address and number of registered workers
#   deploy/local-cluster.sh address [--dir D] prints the scheduler address (for --scheduler)
#
# Every option also has an environment variable (in brackets); flags win.
set -euo pipefail

usage() {
    cat <<'EOF'
usage: local-cluster.sh {start|stop|status|address} [options]

options (environment variable, default):
  --dir DIR               state folder: pid files, logs, scheduler file (DKERNEL_CLUSTER_DIR, ./dask-cluster)
  --host HOST             scheduler listen address (DKERNEL_SCHEDULER_HOST, 127.0.0.1)
  --port PORT             scheduler port, 0 = any free port (DKERNEL_SCHEDULER_PORT, 8786)
  --workers N             worker processes (DKERNEL_WORKERS, number of cores)
  --threads T             threads per worker process (DKERNEL_THREADS, 1)
  --memory-limit M        memory per worker process, e.g. 4GiB or auto (DKERNEL_MEMORY_LIMIT, auto)
  --dashboard-address A   e.g. :8787 (needs bokeh); default: no dashboard (DKERNEL_DASHBOARD_ADDRESS)
  --idle-timeout S        the scheduler exits after S seconds without tasks; 0 = never (DKERNEL_IDLE_TIMEOUT, 0)
  --timeout S             seconds to wait for the scheduler and the workers (DKERNEL_CLUSTER_TIMEOUT, 60)
  --tls-ca-file F --tls-cert F --tls-key F
                          serve and connect over TLS (tls://) with these PEM files
                          (DKERNEL_TLS_CA_FILE, DKERNEL_TLS_CERT, DKERNEL_TLS_KEY)
EOF
}

die() {
    echo "local-cluster.sh: error: $*" >&2
    exit 1
}

[[ $# -ge 1 ]] || { usage >&2; exit 2; }
command="$1"
shift
case "$command" in
    start | stop | status | address) ;;
    -h | --help | help) usage; exit 0 ;;
    *) usage >&2; die "unknown command '$command' (use start, stop, status or address)" ;;
esac

DIR="${DKERNEL_CLUSTER_DIR:-./dask-cluster}"
HOST="${DKERNEL_SCHEDULER_HOST:-127.0.0.1}"
PORT="${DKERNEL_SCHEDULER_PORT:-8786}"
WORKERS="${DKERNEL_WORKERS:-}"  # default: the cores this host lets us use (below)
THREADS="${DKERNEL_THREADS:-1}"
MEMORY="${DKERNEL_MEMORY_LIMIT:-auto}"
DASHBOARD="${DKERNEL_DASHBOARD_ADDRESS:-}"
TIMEOUT="${DKERNEL_CLUSTER_TIMEOUT:-60}"
IDLE_TIMEOUT="${DKERNEL_IDLE_TIMEOUT:-0}"
TLS_CA="${DKERNEL_TLS_CA_FILE:-}"
TLS_CERT="${DKERNEL_TLS_CERT:-}"
TLS_KEY="${DKERNEL_TLS_KEY:-}"
DASK="${DASK:-dask}"
PYTHON="${PYTHON:-python3}"

while [[ $# -gt 0 ]]; do
    case "$1" in -h | --help) usage; exit 0 ;; esac  # "start --help" too
    [[ $# -ge 2 ]] || die "option $1 needs a value"
    case "$1" in
        --dir) DIR="$2" ;;
        --host) HOST="$2" ;;
        --port) PORT="$2" ;;
        --workers) WORKERS="$2" ;;
        --threads) THREADS="$2" ;;
        --memory-limit) MEMORY="$2" ;;
        --dashboard-address) DASHBOARD="$2" ;;
        --timeout) TIMEOUT="$2" ;;
        --idle-timeout) IDLE_TIMEOUT="$2" ;;
        --tls-ca-file) TLS_CA="$2" ;;
        --tls-cert) TLS_CERT="$2" ;;
        --tls-key) TLS_KEY="$2" ;;
        *) usage >&2; die "unknown option '$1'" ;;
    esac
    shift 2
done

is_uint() { [[ "$1" =~ ^[0-9]+$ ]]; }
is_uint "$PORT" || die "--port must be a number, got '$PORT'"
[[ -z "$WORKERS" ]] || { is_uint "$WORKERS" && [[ "$WORKERS" -ge 1 ]]; } \
    || die "--workers must be a positive integer, got '$WORKERS'"
is_uint "$THREADS" && [[ "$THREADS" -ge 1 ]] || die "--threads must be a positive integer, got '$THREADS'"
is_uint "$TIMEOUT" && [[ "$TIMEOUT" -ge 1 ]] || die "--timeout must be a positive number of seconds, got '$TIMEOUT'"
is_uint "$IDLE_TIMEOUT" || die "--idle-timeout must be a number of seconds, got '$IDLE_TIMEOUT'"

# status/address of a TLS cluster reuse the PEM files recorded by start.
if [[ "$command" != start && -z "$TLS_CA$TLS_CERT$TLS_KEY" && -f "$DIR/tls.conf" ]]; then
    { read -r TLS_CA; read -r TLS_CERT; read -r TLS_KEY; } <"$DIR/tls.conf"
fi

PROTOCOL=tcp
TLS_ARGS=()
if [[ -n "$TLS_CA$TLS_CERT$TLS_KEY" ]]; then
    [[ -n "$TLS_CA" && -n "$TLS_CERT" && -n "$TLS_KEY" ]] ||
        die "TLS needs all of --tls-ca-file, --tls-cert and --tls-key"
    for f in "$TLS_CA" "$TLS_CERT" "$TLS_KEY"; do
        [[ -r "$f" ]] || die "TLS file '$f' does not exist or is not readable"
    done
    PROTOCOL=tls
    TLS_ARGS=(--tls-ca-file "$TLS_CA" --tls-cert "$TLS_CERT" --tls-key "$TLS_KEY")
fi

SCHEDULER_FILE="$DIR/scheduler.json"
SCHEDULER_PID="$DIR/scheduler.pid"
WORKERS_PID="$DIR/workers.pid"
SCHEDULER_LOG="$DIR/scheduler.log"
WORKERS_LOG="$DIR/workers.log"

# The informative lines of a log (Dask prints long tracebacks).
show_log() {
    local lines
    lines="$(grep -E 'Error|error|Exception|failed' "$1" 2>/dev/null | tail -n 3 || true)"
    [[ -n "$lines" ]] || lines="$(tail -n 5 "$1" 2>/dev/null || true)"
    [[ -z "$lines" ]] || printf '%s\n' "$lines" | sed 's/^/  | /' >&2
}

# A pid from our pid files that still runs `dask ...` (not a recycled pid).
alive() {
    [[ -n "$1" ]] && kill -0 "$1" 2>/dev/null && [[ "$(ps -ww -o args= -p "$1" 2>/dev/null)" == *dask* ]]
}
# Any process left in the process group led by $1 (the leader may be gone).
group_alive() { [[ -n "$1" ]] && kill -0 -- "-$1" 2>/dev/null; }
read_pid() { [[ -f "$1" ]] && cat "$1" || true; }

# Python snippets run with the same interpreter as the dask CLI where possible.
python_for_dask() {
    local dask_path shebang
    dask_path="$(command -v "$DASK")" || return 1
    shebang="$(head -n 1 "$dask_path" 2>/dev/null || true)"
    if [[ "$shebang" == "#!"*python* && -x "${shebang#\#!}" ]]; then
        echo "${shebang#\#!}"
    else
        echo "$PYTHON"
    fi
}

scheduler_address() {
    [[ -f "$SCHEDULER_FILE" ]] || return 1
    "$PY" -c 'import json, sys; print(json.load(open(sys.argv[1]))["address"])' "$SCHEDULER_FILE"
}

# Count (or wait for) registered workers; prints the count.  Always run in a
# subshell (a command substitution or &): exec makes the subshell's pid
# Python's, so killing a background count kills Python too (it lived on,
# orphaned, waiting for a scheduler file that never came).
count_workers() {
    local want="$1" timeout="$2"
    DKERNEL_TLS_CA_FILE="$TLS_CA" DKERNEL_TLS_CERT="$TLS_CERT" DKERNEL_TLS_KEY="$TLS_KEY" \
        exec "$PY" - "$SCHEDULER_FILE" "$want" "$timeout" <<'EOF'
import os, sys
from distributed import Client
from distributed.security import Security

path, want, timeout = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
kw = {}
if os.environ.get("DKERNEL_TLS_CA_FILE"):
    kw["security"] = Security(tls_ca_file=os.environ["DKERNEL_TLS_CA_FILE"],
                              tls_client_cert=os.environ["DKERNEL_TLS_CERT"],
                              tls_client_key=os.environ["DKERNEL_TLS_KEY"], require_encryption=True)
with Client(scheduler_file=path, timeout=f"{max(timeout, 5)}s", **kw) as c:
    if want > 0:
        c.wait_for_workers(want, timeout=timeout)
    print(len(c.scheduler_info(n_workers=-1)["workers"]))
EOF
}

# SIGTERM the process group of the pid in $1, SIGKILL it after $2 seconds.
stop_group() {
    local pidfile="$1" grace="$2" what="$3" pid i
    pid="$(read_pid "$pidfile")"
    # Each process was started with setsid, so its pid is its process group:
    # the group also holds the nannies' worker processes.  A group whose
    # leader is gone is only signalled if it is still ours (dask processes).
    if ! alive "$pid" && ! { group_alive "$pid" && pgrep -g "$pid" -f 'dask|multiprocessing' >/dev/null 2>&1; }; then
        rm -f "$pidfile"
        return 0
    fi
    kill -TERM -- "-$pid" 2>/dev/null || true
    for ((i = 0; i < grace * 10; i++)); do
        group_alive "$pid" || break
        sleep 0.1
    done
    if group_alive "$pid"; then
        echo "local-cluster.sh: $what (pid $pid) did not stop in ${grace}s; sending SIGKILL" >&2
    fi
    kill -KILL -- "-$pid" 2>/dev/null || true
    rm -f "$pidfile"
    echo "stopped $what (pid $pid)"
}

command -v "$DASK" >/dev/null || die "'$DASK' not found on PATH; install Dask with: pip install 'distributed'"
PY="$(python_for_dask)"
"$PY" -c 'import distributed' 2>/dev/null || die "'$PY' cannot import distributed; set PYTHON to the interpreter of your Dask install"
# the cores this host lets us use: Dask's count, which reads a CPU quota too (nproc does not)
[[ -n "$WORKERS" ]] || WORKERS="$("$PY" -c 'import dask.system; print(dask.system.CPU_COUNT)')"

case "$command" in
stop)
    [[ -d "$DIR" ]] || die "no cluster state folder '$DIR' (started with another --dir?)"
    # Workers first, so they do not log reconnection attempts to a dead scheduler.
    stop_group "$WORKERS_PID" 20 "workers"
    stop_group "$SCHEDULER_PID" 10 "scheduler"
    rm -f "$SCHEDULER_FILE" "$DIR/tls.conf"
    echo "no cluster processes left from '$DIR'"
    exit 0
    ;;
address)
    alive "$(read_pid "$SCHEDULER_PID")" || die "no scheduler running from '$DIR' (start one with: $0 start --dir $DIR)"
    scheduler_address || die "scheduler is running but '$SCHEDULER_FILE' is missing"
    exit 0
    ;;
status)
    alive "$(read_pid "$SCHEDULER_PID")" || die "no scheduler running from '$DIR'"
    addr="$(scheduler_address)" || die "scheduler is running but '$SCHEDULER_FILE' is missing"
    if ! n="$(count_workers 0 10 2>"$DIR/wait.err")"; then
        show_log "$DIR/wait.err"
        die "cannot reach the scheduler at $addr (TLS files? see $SCHEDULER_LOG)"
    fi
    rm -f "$DIR/wait.err"
    echo "scheduler $addr, $n worker(s) registered; logs in $DIR"
    exit 0
    ;;
esac

# ---- start ------------------------------------------------------------------
command -v setsid >/dev/null || die "'setsid' (util-linux) is needed to manage the process groups"
mkdir -p "$DIR"
for f in "$SCHEDULER_PID" "$WORKERS_PID"; do
    pid="$(read_pid "$f")"
    if alive "$pid"; then
        die "a cluster is already running from '$DIR' (pid $pid); stop it first: $0 stop --dir $DIR"
    fi
    rm -f "$f"
done
rm -f "$SCHEDULER_FILE" "$DIR/tls.conf"
if [[ $PROTOCOL == tls ]]; then
    printf '%s\n' "$(realpath "$TLS_CA")" "$(realpath "$TLS_CERT")" "$(realpath "$TLS_KEY")" >"$DIR/tls.conf"
fi

cleanup_on_failure() {
    echo "local-cluster.sh: start failed; stopping what was started (logs: $DIR)" >&2
    stop_group "$WORKERS_PID" 5 "workers" >/dev/null || true
    stop_group "$SCHEDULER_PID" 5 "scheduler" >/dev/null || true
}

IDLE_ARGS=()
[[ "$IDLE_TIMEOUT" -gt 0 ]] && IDLE_ARGS=(--idle-timeout "${IDLE_TIMEOUT}s")
DASHBOARD_ARGS=(--no-dashboard)
[[ -n "$DASHBOARD" ]] && DASHBOARD_ARGS=(--dashboard-address "$DASHBOARD")

# setsid: a process group per service, so stop (and any supervisor) can signal
# the scheduler or all workers, nannies and their children, at once.
setsid "$DASK" scheduler --host "$HOST" --port "$PORT" --protocol "$PROTOCOL" "${TLS_ARGS[@]}" \
    "${DASHBOARD_ARGS[@]}" "${IDLE_ARGS[@]}" --scheduler-file "$SCHEDULER_FILE" \
    </dev/null >"$SCHEDULER_LOG" 2>&1 &
echo $! >"$SCHEDULER_PID"
# From here on, any failure (a die, or a command failing under set -e) stops
# whatever was started, so a failed start leaves no stray processes.
STARTED=0
on_exit() {
    local rc=$?
    if [[ $STARTED != 1 ]]; then
        cleanup_on_failure
    fi
    exit "$rc"
}
trap on_exit EXIT

deadline=$((SECONDS + TIMEOUT))
until [[ -s "$SCHEDULER_FILE" ]]; do
    if ! kill -0 "$(read_pid "$SCHEDULER_PID")" 2>/dev/null; then  # just started: no name check
        show_log "$SCHEDULER_LOG"
        die "the scheduler exited during start-up (port $PORT in use?); log: $SCHEDULER_LOG"
    fi
    if ((SECONDS >= deadline)); then
        die "the scheduler did not start within ${TIMEOUT}s; log: $SCHEDULER_LOG"
    fi
    sleep 0.2
done
# The scheduler file is written before the scheduler is fully up; it holds the address.
sleep 0.2
ADDRESS="$(scheduler_address)"

# glibc settings for the worker processes, as dkernel's own LocalCluster gives
# them (dkernel/engine/cluster.py, WORKER_MALLOC): chunk-sized buffers are
# reused instead of faulting in fresh pages on every read.  A nanny passes its
# environment's values on and they win over Dask's configured 64 KiB.
# --death-timeout: workers exit by themselves if the scheduler disappears.
MALLOC_TRIM_THRESHOLD_=67108864 MALLOC_MMAP_THRESHOLD_=33554432 \
setsid "$DASK" worker "$ADDRESS" --nworkers "$WORKERS" --nthreads "$THREADS" \
    --memory-limit "$MEMORY" --local-directory "$DIR/worker-space" "${TLS_ARGS[@]}" \
    --no-dashboard --death-timeout 60 \
    </dev/null >"$WORKERS_LOG" 2>&1 &
echo $! >"$WORKERS_PID"

# waited for in the background, watching the workers' process: one that
# exits at start (a bad --memory-limit) ends the wait instead of the timeout
count_workers "$WORKERS" "$TIMEOUT" >"$DIR/count.out" 2>"$DIR/wait.err" &
counter=$!
while kill -0 "$counter" 2>/dev/null; do
    if ! alive "$(read_pid "$WORKERS_PID")"; then
        kill "$counter" 2>/dev/null || true
        wait "$counter" 2>/dev/null || true
        rm -f "$DIR/count.out"
        show_log "$WORKERS_LOG"
        die "'$DASK worker' exited at start; log: $WORKERS_LOG"
    fi
    sleep 0.5
done
if ! wait "$counter"; then
    show_log "$WORKERS_LOG"
    show_log "$DIR/wait.err"
    die "$WORKERS worker(s) did not register with $ADDRESS within ${TIMEOUT}s; log: $WORKERS_LOG"
fi
n="$(cat "$DIR/count.out")"
rm -f "$DIR/count.out"
STARTED=1
rm -f "$DIR/wait.err"
echo "scheduler $ADDRESS with $n worker(s) x $THREADS thread(s); logs and pid files in $DIR"
echo "use it:   dkernel fit STORE ... --scheduler $ADDRESS    (or export DASK_SCHEDULER_ADDRESS=$ADDRESS)"
echo "stop it:  $0 stop --dir $DIR"
