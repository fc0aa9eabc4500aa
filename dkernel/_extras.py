"""Optional dependencies: a missing one stops with the pip extra that installs it."""

from __future__ import annotations

import importlib


def require(what: str, extra: str, *modules: str) -> None:
    """Import ``modules`` or stop with one line: ``what`` needs the missing
    one, and ``pip install 'dkernel[extra]'`` brings it."""
    for name in modules:
        try:
            importlib.import_module(name)
        except ModuleNotFoundError as exc:
            missing = (exc.name or name).split(".")[0]
            raise ModuleNotFoundError(
                f"{what} needs {missing}, which is not installed here: "
                f"pip install 'dkernel[{extra}]'", name=missing) from None
        except ImportError as exc:
            # installed but broken, e.g. a pyarrow built for numpy 1 under numpy 2:
            # "not installed" sent the user to install what they had
            top = name.split(".")[0]
            raise ImportError(
                f"{what} needs {top}, which is installed but does not import ({exc}); "
                f"reinstall it to match this environment: pip install -U 'dkernel[{extra}]'",
                name=top) from exc
