"""Start and stop a real external cluster (``dask scheduler`` + ``dask worker``
processes on 127.0.0.1) through the deploy recipe ``deploy/local-cluster.sh``."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

RECIPE = Path(__file__).resolve().parents[1] / "deploy" / "local-cluster.sh"


def recipe_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment for the recipe: this interpreter's ``dask`` CLI first on PATH."""
    env = {**os.environ, **(extra or {})}
    bindir = str(Path(sys.executable).parent)
    env["PATH"] = bindir + os.pathsep + env.get("PATH", "")
    return env


def recipe(*args: str, env: dict[str, str] | None = None,
           timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(RECIPE), *args], check=False, capture_output=True,
                          text=True, timeout=timeout, env=recipe_env(env))


def _kill_groups(state: Path) -> list[int]:
    alive = []
    for name in ("workers.pid", "scheduler.pid"):
        f = state / name
        if f.exists():
            pid = int(f.read_text().strip())
            try:
                os.killpg(pid, signal.SIGKILL)
                alive.append(pid)
            except ProcessLookupError:
                pass
    return alive


@contextmanager
def recipe_cluster(state: Path, workers: int, *extra: str,
                   env: dict[str, str] | None = None) -> Iterator[str]:
    """The scheduler address of a cluster started with the recipe; stopped on exit.

    ``--port 0`` (any free port) so parallel runs never collide;
    ``--idle-timeout`` so the scheduler exits by itself should the test
    process die before the teardown runs."""
    proc = recipe("start", "--dir", str(state), "--port", "0", "--workers", str(workers),
                  "--threads", "1", "--memory-limit", "1GiB", "--timeout", "60",
                  "--idle-timeout", "300", *extra, env=env)
    if proc.returncode != 0:
        _kill_groups(state)
        raise RuntimeError(f"deploy/local-cluster.sh start failed:\n{proc.stdout}\n{proc.stderr}")
    try:
        yield json.loads((state / "scheduler.json").read_text())["address"]
    finally:
        try:
            stop = recipe("stop", "--dir", str(state), env=env, timeout=60)
        finally:
            survivors = _kill_groups(state)
        assert stop.returncode == 0, stop.stderr
        assert survivors == [], f"processes survived the recipe's stop: {survivors}"


def stop_process_groups(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each process group (last started first), then SIGKILL any that
    has not exited within 20 s."""
    for p in reversed(procs):
        os.killpg(p.pid, signal.SIGTERM)
    for p in reversed(procs):
        try:
            p.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
