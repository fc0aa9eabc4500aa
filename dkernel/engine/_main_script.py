"""Whether the main script survives being re-run by spawned worker processes.

A LocalCluster's workers are spawned: each first re-runs the main script as
``__mp_main__`` (:mod:`multiprocessing.spawn`).  Code at the script's top level
that is not under ``if __name__ == "__main__":`` then runs again in every
worker, and a fit there starts a cluster of its own inside a process still
bootstrapping: the user saw about 340 lines of "Nanny failed to start" after
30 s.  :func:`check_main_rerunnable` refuses such a start in one line first.
"""

from __future__ import annotations

import ast
import os
import sys
from types import FrameType

#: the advice every refusal ends with
_OR_THREADS = "or pass client=distributed.Client(processes=False)"


def check_main_rerunnable() -> None:
    """Refuse to start spawned workers where re-running the main script fails:
    a program read from standard input (no file to re-run), or a call from the
    script's top level outside its ``if __name__ == "__main__":`` guard."""
    import multiprocessing.process

    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    spec = getattr(main, "__spec__", None)
    if path is None or getattr(sys, "frozen", False):
        return  # (an interactive session, -c, a notebook or a frozen app: nothing re-runs)
    if spec is not None and (spec.name == "__main__" or spec.name.endswith(".__main__")):
        return  # (``python -m package``: spawn does not re-run a package's __main__)
    if spec is None:
        origin = multiprocessing.process.ORIGINAL_DIR
        if not os.path.isfile(os.path.join(origin or "", path)):
            raise RuntimeError(
                f"dkernel's local cluster starts worker processes, which first re-run the "
                f"main script, and {path!r} is not a file (a program read from standard "
                f"input?): save it to a file and run that, {_OR_THREADS}")
    line = _unguarded_call_line(path)
    if line is not None:
        raise RuntimeError(
            f"dkernel's local cluster starts worker processes, which first re-run the main "
            f"script, and {os.path.basename(path)} line {line} starts this cluster outside "
            f"an `if __name__ == \"__main__\":` block, so every worker would start one too: "
            f"put the script's work under that guard, {_OR_THREADS}")


def _unguarded_call_line(path: str) -> int | None:
    """The line of the main script's top level that led to this call, where
    that line is not in the body of an ``if __name__ == "__main__":``; None
    where it is, or where it cannot be told (another thread, no source)."""
    frame = _main_module_frame(path)
    if frame is None:
        return None
    line = frame.f_lineno
    try:
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, UnicodeDecodeError, ValueError):
        return None
    return None if _guarded(tree.body, line) else line


def _main_module_frame(path: str) -> FrameType | None:
    """The frame running the main script's top level, if this call came from it."""
    target = os.path.realpath(path)
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        if (frame.f_code.co_name == "<module>"
                and frame.f_globals.get("__name__") == "__main__"
                and os.path.realpath(frame.f_code.co_filename) == target):
            return frame
        frame = frame.f_back
    return None


def _guarded(body: list[ast.stmt], line: int) -> bool:
    """Whether ``line`` lies, within the statements ``body``, in the body of an
    ``if`` that tests ``__name__`` against "__main__" (at any depth: a guard
    inside a ``try`` or ``with`` counts; its ``else`` branch runs in workers)."""
    for stmt in body:
        end = getattr(stmt, "end_lineno", None) or stmt.lineno
        if not stmt.lineno <= line <= end:
            continue
        if isinstance(stmt, ast.If) and _is_main_test(stmt.test):
            return any(s.lineno <= line <= (s.end_lineno or s.lineno) for s in stmt.body)
        return any(_guarded(getattr(stmt, field), line)
                   for field in ("body", "orelse", "finalbody", "handlers")
                   if isinstance(getattr(stmt, field, None), list))
    return False


def _is_main_test(test: ast.expr) -> bool:
    """``__name__ == "__main__"`` (either way round, alone or in an ``and``)."""
    if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return any(_is_main_test(v) for v in test.values)
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1
            and isinstance(test.ops[0], ast.Eq)):
        return False
    sides = [test.left, *test.comparators]
    return (any(isinstance(s, ast.Name) and s.id == "__name__" for s in sides)
            and any(isinstance(s, ast.Constant) and s.value == "__main__" for s in sides))
