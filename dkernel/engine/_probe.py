"""What a worker reports about its software.  This module imports nothing of
dkernel: its function is sent to the workers by value (cloudpickle's
``register_pickle_by_value``, :mod:`dkernel.engine.versions`), so it runs on a
worker that has another dkernel, or none."""

from __future__ import annotations


def package_versions(names: list[str]) -> dict[str, str | None]:
    """``{name: __version__ of the module this process imports, or None}``.

    The imported module's own ``__version__``, not the installed
    distribution's metadata: a package on PYTHONPATH or uploaded to the
    worker wins over the installed one, and it is the one that runs tasks."""
    import importlib

    found: dict[str, str | None] = {}
    for name in names:
        try:
            module = importlib.import_module(name)
        except ImportError:
            found[name] = None
        else:
            found[name] = str(getattr(module, "__version__", "unknown"))
    return found
