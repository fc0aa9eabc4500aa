"""Where a warning points: the first frame outside dkernel (no dkernel imports)."""

from __future__ import annotations

import os
import sys

_PACKAGE = os.path.dirname(__file__) + os.sep  # (as the code objects of its modules spell it)


def user_stacklevel() -> int:
    """``stacklevel`` for a ``warnings.warn`` called by this function's caller
    that names the first frame outside the package: the user's line that
    called ``fit`` or ``open_dataset``.  A count written by hand at each call
    was one or two frames off wherever a call path gained a frame (a
    decorator, a helper), and then named a line of dkernel instead.  Where
    every frame is dkernel's (the CLI), the outermost."""
    frame, level = sys._getframe(1), 1
    while frame.f_back is not None and frame.f_code.co_filename.startswith(_PACKAGE):
        frame, level = frame.f_back, level + 1
    return level
