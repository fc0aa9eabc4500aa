"""A step's fixed cost against the number of lanes: the t_fixed(W) of docs/scaling.md.

Null steps (a partial that does no arithmetic on its 64 rows) on a
LocalCluster of W single-threaded worker processes and a real scheduler, one
lane per worker, so the time is the client round trip, the scheduling of W
tasks and the reduction.  With ``--features D`` (default 2048, DSG's and
EigenPro-RF's default model) each step also carries a real model's traffic:
theta out to every lane, a gradient back.  Prints per step: ms, scheduler
tasks, the client's CPU ms and the bytes it sends and receives (computed from
the payload sizes -- theta's bytes a lane out, a gradient a partial the client
gathers in, benchmarks/throughput.py ``step_overhead`` -- not captured on
the wire, so serialisation and Dask's own messages are not in them); then the line
through the widths whose partials the client sums itself (W <= 8; its slope
is the per-task term of the 10 TB projection) and, for wider steps, what the
sums on the workers add over that line.

    python benchmarks/step_overhead.py                      # W = 1 2 4 8 16 32 64
    python benchmarks/step_overhead.py --workers 1 2 4 --steps 400 --features 0

On a machine with fewer cores than W the idle workers' own event loops share
the cores with the scheduler and the client: ms a step and the client's CPU
are then upper bounds (the slope too); tasks a step are counted exactly, and the
bytes are computed from the payload sizes, not measured.
"""

from __future__ import annotations

import argparse
import json
import logging
import os

from throughput import step_overhead

from dkernel.engine.reduce import _FAN_IN as FAN_IN


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    p.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32, 64])
    p.add_argument("--features", type=int, default=2048,
                   help="model size each step ships out and back (0: no payload)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--repeat", type=int, default=3, help="runs per W; the fastest is kept")
    args = p.parse_args()
    if min(args.workers) < 1 or args.steps < 1 or args.repeat < 1 or args.features < 0:
        # (local_cluster(0) starts one worker per core: a row labelled 0 lanes)
        p.error("--workers, --steps and --repeat must be at least 1, --features at least 0")

    import numpy as np
    from distributed import Client

    from dkernel.engine import local_cluster

    rows = []
    for w in args.workers:
        with local_cluster(w, silence_logs=logging.ERROR, memory_limit="1GiB") as cluster, \
                Client(cluster) as client:
            client.wait_for_workers(w)
            step_overhead(client, 20, args.features)  # warm: imports, first connections
            runs = [step_overhead(client, args.steps, args.features)
                    for _ in range(args.repeat)]
            best = min(runs, key=lambda r: r["seconds_per_step"])
            all_ms = [1e3 * r["seconds_per_step"] for r in runs]
            rows.append({"workers": w, **best, "all_ms": all_ms})
            print(f"{w:3d} lanes: {1e3 * best['seconds_per_step']:6.1f} ms a step, "
                  f"{best['tasks_per_step']:.1f} tasks, client CPU "
                  f"{1e3 * best['client_cpu_per_step']:.1f} ms, "
                  f"{best['bytes_out_per_step'] / 1e3:.0f} kB out / "
                  f"{best['bytes_in_per_step'] / 1e3:.0f} kB in "
                  f"(runs {' '.join(f'{v:.1f}' for v in all_ms)} ms)", flush=True)
    direct = [r for r in rows if r["workers"] <= FAN_IN]
    if len(direct) > 1:
        # up to FAN_IN lanes the client gathers the partials itself: one task a
        # lane, so a straight line; past it the partials are summed on the workers
        w = np.array([r["workers"] for r in direct], float)
        t = np.array([r["seconds_per_step"] for r in direct])
        slope, intercept = np.polyfit(w, t, 1)
        print(f"fit: t_fixed(W) = {1e3 * intercept:.1f} ms + {1e3 * slope:.2f} ms x W "
              f"(least squares over W = {' '.join(str(int(v)) for v in w)}; "
              f"{os.cpu_count()} cores here)")
        for r in rows:
            if r["workers"] > FAN_IN:
                levels = int(np.ceil(np.log(r["workers"]) / np.log(FAN_IN))) - 1
                extra = r["seconds_per_step"] - (intercept + slope * r["workers"])
                print(f"{r['workers']:3d} lanes: {1e3 * extra:.1f} ms over the line for "
                      f"{levels} level(s) of sums on the workers")
        rows.append({"intercept_s": intercept, "slope_s_per_lane": slope})
    print(json.dumps(rows))


if __name__ == "__main__":
    main()
