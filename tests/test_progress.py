"""The progress line: rewritten in place on a terminal, a few complete lines
elsewhere (notebooks, logs)."""

from __future__ import annotations

import io
import re

import numpy as np
import pytest

from dkernel.engine.progress import Progress


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_outside_a_terminal_prints_one_complete_line_per_tenth_of_the_work():
    out = io.StringIO()
    p = Progress(1000, "dsg", True, stream=out, interval=0.0)
    for _ in range(1000):
        p.update(1, loss=0.5)
    p.close()
    lines = out.getvalue().split("\n")
    assert lines[-1] == "" and "\r" not in out.getvalue()
    lines = lines[:-1]
    assert len(lines) == 10  # 100, 200, ..., 1000 steps
    assert lines[0].startswith("dsg: 100/1000 steps |") and "eta" in lines[0]
    assert lines[-1].startswith("dsg: 1000/1000 steps |") and "eta" not in lines[-1]
    assert lines[-1].endswith("loss 0.5")


def test_on_a_terminal_the_line_is_rewritten_in_place_and_ends_with_a_newline():
    out = _Terminal()
    p = Progress(5, "kpca", True, stream=out, interval=0.0)
    for _ in range(5):
        p.update(1)
    p.close()
    text = out.getvalue()
    assert text.count("\r") == 5 and text.endswith("\n") and text.count("\n") == 1


def test_disabled_progress_prints_nothing():
    out = io.StringIO()
    p = Progress(10, "x", False, stream=out)
    for _ in range(10):
        p.update(1)
    p.close()
    assert out.getvalue() == ""


def test_the_end_is_printed_once_and_no_work_prints_nothing():
    # an ingest's positions reach the total before its last chunks are written:
    # each printed the "done" line again
    out = io.StringIO()
    bar = Progress(3, "ingest", True, stream=out, unit="MB")
    bar.update(0)
    assert out.getvalue() == ""
    bar.update(3)
    bar.update(0)
    bar.update(0)
    assert out.getvalue().count("ingest: 3/3 MB") == 1


def test_evaluate_pools_r2_about_the_training_mean_without_losing_digits():
    # each chunk's mean of 1e12 + x carried rounding in proportion to 1e12: SS_tot
    # 2e-6 off (the old reduction centred every row on one mean)
    import dask.array as da
    import numpy as np

    from dkernel.estimators.scoring import r2_sums_by_chunk

    x = np.random.default_rng(0).normal(size=1000)
    y, p = 1e12 + x, 1e12 + 0.9 * x
    stored = y - 1e12  # (exact: y holds x to 1e12's float64 spacing)
    exact = ((stored - stored.mean()) ** 2).sum()
    yd, pd_ = da.from_array(y, chunks=64), da.from_array(p, chunks=64)
    _, ss_tot, rows = r2_sums_by_chunk(yd, pd_, False, shift=1e12)
    assert rows == 1000 and abs(ss_tot[0] - exact) / exact < 1e-9


def test_work_that_prints_nothing_is_named_after_a_quiet_spell_innermost_phase_first():
    # kernel EigenPro's client eigensolve sat 9-45 s without a line, FALKON's
    # preconditioner 120 s, a cluster's start 10-28 s
    import time

    import dask

    from dkernel.engine.progress import phase

    out = io.StringIO()
    with dask.config.set({"dkernel.progress-heartbeat": 0.5}):
        with phase("dkernel fit", True, stream=out):
            with phase("eigenpro: preconditioner", True, stream=out):
                time.sleep(1.3)
            inner = out.getvalue()
            bar = Progress(40, "epochs", True, stream=out)
            for _ in range(40):  # lines closer than the heartbeat: no heartbeat between
                bar.update(1)
                time.sleep(0.02)
            busy = out.getvalue()[len(inner):]
            time.sleep(1.3)
        with phase("quiet", False, stream=out):
            time.sleep(1.0)
    assert "eigenpro: preconditioner: running" in inner and "dkernel fit" not in inner
    during = busy[busy.index("epochs: "):]  # (the outer phase may speak once before)
    assert "running" not in during and "epochs: 40/40" in during
    rest = out.getvalue()[len(inner) + len(busy):]
    assert "dkernel fit: running" in rest and "quiet" not in rest
    time.sleep(0.8)
    assert out.getvalue()[len(inner) + len(busy):] == rest  # nothing once every phase ended


def test_a_heartbeat_ends_its_line_on_a_terminal_and_outlives_a_stream_that_failed():
    # on a terminal the next print was glued onto the heartbeat; a stream that
    # raised once (a closed pipe) stopped every later heartbeat of the process
    import time

    import dask

    from dkernel.engine.progress import phase

    class Closed(io.StringIO):
        def write(self, text: str) -> int:
            raise ValueError("I/O operation on closed file")

    tty = _Terminal()
    with dask.config.set({"dkernel.progress-heartbeat": 0.3}):
        with phase("broken", True, stream=Closed()):
            time.sleep(0.8)
        time.sleep(1.2)  # (the thread that met the closed stream has ended)
        with phase("fit", True, stream=tty):
            time.sleep(0.8)
    assert "fit: running" in tty.getvalue() and tty.getvalue().endswith("\n")


def test_dkernels_own_dask_settings_are_checked_and_a_heartbeat_of_0_is_off(client):
    # progress-heartbeat 0 printed 60,000 lines in a 3 s fit, "abc" killed the
    # heartbeat thread with tracebacks; cache-fraction 5 or -1 was taken as given
    import time

    import dask

    from dkernel import DSGRegressor
    from dkernel.engine.progress import phase

    out, other = io.StringIO(), io.StringIO()
    with dask.config.set({"dkernel.progress-heartbeat": 0}):
        with phase("fit", True, stream=out):
            time.sleep(0.5)
    # and where a heartbeat thread already runs (an earlier phase of the process)
    with dask.config.set({"dkernel.progress-heartbeat": 0.3}):
        with phase("outer", True, stream=other):
            time.sleep(1.3)  # (a few heartbeats of 0.3 s, on a loaded machine too)
            with dask.config.set({"dkernel.progress-heartbeat": 0}):
                with phase("fit", True, stream=out):
                    time.sleep(0.8)
    assert "outer: running" in other.getvalue() and out.getvalue() == ""
    X = np.random.default_rng(0).normal(size=(400, 3))
    for key, value, span in [("dkernel.progress-heartbeat", "abc", "at least 0"),
                             ("dkernel.progress-heartbeat", -1, "at least 0"),
                             ("dkernel.cache-fraction", 5, "in [0, 1]"),
                             ("dkernel.cache-live-seconds", -5, "at least 0")]:
        variable = "DASK_" + key.upper().replace(".", "__").replace("-", "_")
        with dask.config.set({key: value}), pytest.raises(
                ValueError, match=rf"^the Dask configuration's {key} is {value!r}, not a number "
                                  rf"{re.escape(span)}: fix it .*{variable}"):
            DSGRegressor(n_features=32, n_epochs=2, verbose=True, client=client).fit(X, X[:, 0])


def test_advice_stream_gives_up_on_a_gone_reader_only():
    # a full non-blocking stderr (EAGAIN) was taken for a dead one, and the
    # command's last error line was lost with it
    import errno as errno_

    from dkernel.files import AdviceStream

    class Failing:
        def __init__(self, err):
            self.err, self.lines = err, []

        def write(self, text):
            if self.err is not None:
                err, self.err = self.err, None
                raise err
            self.lines.append(text)
            return len(text)

        def flush(self):
            pass

    full = Failing(BlockingIOError(errno_.EAGAIN, "full"))
    stream = AdviceStream(full)
    stream.write("dropped\n")
    stream.write("kept\n")
    assert not stream.dead and full.lines == ["kept\n"]
    gone = Failing(BrokenPipeError(errno_.EPIPE, "Broken pipe"))
    stream = AdviceStream(gone)
    stream.write("a\n")
    stream.write("b\n")
    assert stream.dead and gone.lines == []
    assert AdviceStream(None).write("x") == 1  # (stderr closed: sys.stderr is None)


def test_a_progress_line_started_at_its_total_still_prints_its_end():
    # a fit resumed from its last step starts its line at the total: the end and its
    # metrics must still be printed (outside a terminal nothing came out)
    import io

    from dkernel.engine.progress import Progress

    out = io.StringIO()
    Progress(10, "fit", True, stream=out, start=10).update(0, loss=0.25)
    assert out.getvalue().startswith("fit: 10/10 steps") and "loss 0.25" in out.getvalue()
