#!/usr/bin/env bash
# Entry point of the dkernel image: one image runs as scheduler, worker or job.
#
#   scheduler [dask scheduler options]   a Dask scheduler on :8786, dashboard on :8787
#   worker    [dask worker options]      workers for $DASK_SCHEDULER_ADDRESS, one thread per process
#   job       DKERNEL-ARGS...            a dkernel command, e.g. job fit /data/train.zarr --out ...
#   demo, fit, ingest, ... ARGS          the same without "job" (what "docker compose run job
#                                        demo ..." hands over: compose replaces the command)
#   dask-scheduler / dask-worker ARGS    as "dask scheduler/worker ARGS" (the Helm chart's commands)
#   anything else                        run as given (dask ..., a shell, python, ...)
set -euo pipefail

role="${1:-job}"
[[ $# -gt 0 ]] && shift
case "$role" in
    scheduler)
        exec dask scheduler --host 0.0.0.0 --port "${DASK_SCHEDULER_PORT:-8786}" \
            --dashboard-address ":${DASK_DASHBOARD_PORT:-8787}" "$@"
        ;;
    worker)
        : "${DASK_SCHEDULER_ADDRESS:?set DASK_SCHEDULER_ADDRESS, e.g. tcp://scheduler:8786}"
        # One single-threaded process per core (NumPy/BLAS brings its own
        # threads; see deploy/README.md), memory split between them.  By
        # default the cores are Dask's count (--nworkers -1), which reads the
        # container's CPU quota as well as its CPU set: nproc sees only the
        # set, so "docker run --cpus 2" on a 64-core host started 64 workers.
        exec dask worker "$DASK_SCHEDULER_ADDRESS" \
            --nworkers "${DKERNEL_WORKERS:--1}" --nthreads 1 \
            --memory-limit "${DKERNEL_MEMORY_LIMIT:-auto}" \
            --local-directory "${DKERNEL_LOCAL_DIRECTORY:-/tmp/dask-worker-space}" \
            --death-timeout 60 "$@"
        ;;
    job)
        exec dkernel "$@"
        ;;
    # dkernel's commands (tests/test_deploy_image.py checks this list against the CLI's)
    ingest | make-store | fit | predict | transform | evaluate | info | plot | demo)
        exec dkernel "$role" "$@"
        ;;
    dask-scheduler | dask-worker)
        # the pre-2023 command names, still used by the "dask" Helm chart
        exec dask "${role#dask-}" "$@"
        ;;
    *)
        exec "$role" "$@"
        ;;
esac
