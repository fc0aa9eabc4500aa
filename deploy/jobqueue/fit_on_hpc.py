"""A dkernel fit on an HPC batch system (SLURM or PBS) with dask-jobqueue.

Run it on a login node (it is the client and runs the scheduler; the
workers are batch jobs)::

    pip install dkernel dask-jobqueue
    python deploy/jobqueue/fit_on_hpc.py --system slurm --jobs 4 --queue normal \\
        --account myproject --memory 16GiB --processes 4 --local-directory '$TMPDIR' \\
        /shared/data/train.zarr --out /shared/models/dsg.npz -- --n-features 8192 --n-epochs 5

``--print-job-script`` prints the batch script a worker job is submitted with
and exits (no batch system needed).  Arguments after ``--`` go to
``dkernel fit`` unchanged.  The store and the model path must be on a file
system every node sees under the same path (or an s3:// URL).

Worker settings are dkernel's: single-threaded worker processes (``cores``
equals ``processes``, so one thread each: NumPy/BLAS brings its own
threads), a memory limit per process, and a node-local scratch folder for
spilling.
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from typing import Any

SYSTEMS = ("slurm", "pbs")


def make_cluster(system: str = "slurm", *, processes: int = 1, memory: str = "4GiB",
                 local_directory: str = "/tmp", queue: str | None = None,
                 account: str | None = None, walltime: str = "01:00:00",
                 python: str | None = None, **kwargs: Any) -> Any:
    """A dask-jobqueue cluster whose every job runs ``processes`` worker
    processes with one thread each, ``memory`` per job split between them.

    Nothing is submitted until ``cluster.scale(jobs=N)``."""
    import dask
    import dask_jobqueue

    if system not in SYSTEMS:
        raise ValueError(f"system must be one of {', '.join(SYSTEMS)}, got {system!r}")
    cls = {"slurm": dask_jobqueue.SLURMCluster, "pbs": dask_jobqueue.PBSCluster}[system]
    kwargs.setdefault("scheduler_options", {"dashboard_address": ":8787"})
    # glibc settings of dkernel's own workers (dkernel.engine.cluster.WORKER_MALLOC):
    # Dask's 64 KiB trim threshold makes every chunk-sized buffer fault in fresh pages
    from dkernel.engine.cluster import WORKER_MALLOC

    # after the site's own prologue lines (a module load, a venv: given here, or
    # in the Dask config, which dask-jobqueue reads only when none is given),
    # unless a line exports or unsets the name itself
    given = kwargs.pop("job_script_prologue", None)
    if given is None:
        given = dask.config.get(f"jobqueue.{system}.job-script-prologue", None)
    prologue = list(given or [])
    prologue += [f"export {name}={value}" for name, value in WORKER_MALLOC.items()
                 if not any(re.match(rf"\s*(export\s+{name}=|unset\s+{name}\b|"
                                     rf"declare\s+-x\s+{name}=)", line) for line in prologue)]
    kwargs["job_script_prologue"] = prologue
    return cls(
        cores=processes,          # = processes: one thread per worker process
        processes=processes,
        memory=memory,            # per job; each process gets memory / processes
        local_directory=local_directory,
        queue=queue,
        account=account,
        walltime=walltime,
        python=python or sys.executable,
        # workers exit by themselves should the scheduler (this script) go away;
        # dask-jobqueue writes --death-timeout itself (60 by default), so it is
        # set here and not again in worker_extra_args
        death_timeout=120,
        **kwargs,
    )


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    fit_args: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, fit_args = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("store", nargs="?", help="dataset store (shared path or s3:// URL)")
    p.add_argument("--out", help="model file (shared path or s3:// URL)")
    p.add_argument("--system", choices=SYSTEMS, default="slurm")
    p.add_argument("--jobs", type=int, default=2, help="batch jobs of workers")
    p.add_argument("--processes", type=int, default=1, help="worker processes per job")
    p.add_argument("--memory", default="4GiB", help="memory per job")
    p.add_argument("--local-directory", default="/tmp", help="node-local scratch folder")
    p.add_argument("--queue")
    p.add_argument("--account")
    p.add_argument("--walltime", default="01:00:00")
    p.add_argument("--dashboard-address", default=":8787", help="the scheduler's dashboard")
    p.add_argument("--print-job-script", action="store_true",
                   help="print a worker job's batch script and exit")
    args = p.parse_args(argv)
    if not args.print_job_script:  # before any job is submitted
        if not args.store or not args.out:
            p.error("give STORE and --out (or --print-job-script)")
        from dkernel.data import open_dataset

        try:
            open_dataset(args.store)
        except (OSError, ValueError) as exc:
            p.error(str(exc))
    cluster = make_cluster(args.system, processes=args.processes, memory=args.memory,
                           local_directory=args.local_directory, queue=args.queue,
                           account=args.account, walltime=args.walltime,
                           scheduler_options={"dashboard_address": args.dashboard_address})
    with cluster:
        if args.print_job_script:
            print(cluster.job_script())
            return 0
        from distributed import Client

        from dkernel.cli import main as dkernel

        cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            # the fit starts once the first jobs run; more workers join as they start
            _wait_for_workers(client, args.processes, args.jobs * args.processes)
            return dkernel(["fit", args.store, "--scheduler", cluster.scheduler_address,
                            "--out", args.out, *fit_args])


def _wait_for_workers(client: Any, least: int, wanted: int, timeout: float = 3600.0,
                      every: float = 30.0) -> None:
    """Wait for ``least`` workers, saying every ``every`` seconds how many run
    (batch jobs can queue for an hour: the wait said nothing)."""
    start = time.monotonic()
    while True:
        try:
            client.wait_for_workers(least, timeout=every)
            return
        except TimeoutError:
            waited = time.monotonic() - start
            if waited >= timeout:
                raise TimeoutError(f"{least} worker(s) did not start in {timeout:.0f} s; check "
                                   "the batch queue (squeue / qstat)") from None
            running = len(client.scheduler_info(n_workers=-1)["workers"])
            print(f"fit_on_hpc: waiting for the batch jobs: {running} of {wanted} worker(s) "
                  f"after {waited:.0f} s", file=sys.stderr, flush=True)


if __name__ == "__main__":
    sys.exit(main())
