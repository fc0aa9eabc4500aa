"""The progress line: rewritten in place on a terminal, a few complete lines
elsewhere (notebooks, logs)."""

from __future__ import annotations

import io

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
