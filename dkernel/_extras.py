"""Optional dependencies: a missing one stops with the pip extra that installs it."""

from __future__ import annotations

import importlib


def require(what: str, extra: str, *modules: str) -> None:
    """Import ``modules`` or stop with one line: ``what`` needs the missing
    one, and ``pip install 'dkernel[extra]'`` brings it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ImportError as exc:
            missing = (exc.name or name).split(".")[0]
            raise ModuleNotFoundError(
                f"{what} needs {missing}, which is not installed here: "
                f"pip install 'dkernel[{extra}]'", name=missing) from None
