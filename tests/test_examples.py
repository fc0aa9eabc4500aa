"""Every script of the examples gallery (examples/*.py) runs to the end in
small mode (DKERNEL_EXAMPLE_SMALL=1: small synthetic data), in its own
process, against the session's cluster ($DASK_SCHEDULER_ADDRESS), and exits
0.  An example checks its own results and exits non-zero when one is off."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SCRIPTS = sorted(p.name for p in EXAMPLES.glob("*.py") if not p.name.startswith("_"))
# seconds one small-mode example may take before the test calls it stuck
TIMEOUT = 300


def test_the_gallery_has_an_example_per_capability():
    assert len(SCRIPTS) >= 10, SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_example_runs_in_small_mode(script, client, tmp_path):
    env = {**os.environ, "DKERNEL_EXAMPLE_SMALL": "1", "MPLBACKEND": "Agg",
           "DASK_SCHEDULER_ADDRESS": client.scheduler.address,
           "DKERNEL_EXAMPLE_DATA": str(tmp_path / "data")}
    t0 = time.perf_counter()
    run = subprocess.run([sys.executable, str(EXAMPLES / script)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=TIMEOUT)
    seconds = time.perf_counter() - t0
    assert run.returncode == 0, f"{script} failed:\n{run.stdout[-4000:]}\n{run.stderr[-4000:]}"
    assert run.stdout.strip(), f"{script} printed nothing"
    print(f"{script}: {seconds:.1f} s")
