"""The workers run the software the client runs: checked when dkernel connects
to a cluster it did not start, before any task is sent.

Tasks are dkernel functions unpickled on the workers, so a worker with
another dkernel (or none) would fail deep in a task's traceback, or worse,
compute with other code.  Such a worker is refused in one line naming it and
both versions; ``upload_package=True`` (``--upload-package``) instead sends
this client's dkernel to the workers with distributed's ``UploadDirectory``
plugin, which unpacks it beside each worker, puts it first on the worker's
``sys.path`` and restarts the worker."""

from __future__ import annotations

import logging
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import cloudpickle

from dkernel._version import __version__
from dkernel.engine import _probe

#: The packages whose versions must match: dkernel's own (refused when it
#: differs), and those that carry its tasks and data (a warning when they
#: differ, refused when missing: a worker without scipy passed, and its first
#: task killed it).
PACKAGES = ("dkernel", "dask", "distributed", "numpy", "zarr", "scipy", "sklearn")

#: Seconds to wait for the workers to come back after an upload restarts them.
UPLOAD_TIMEOUT = 120.0

# The probe must run on a worker whose dkernel differs or is missing, so it
# travels by value instead of as a reference to a dkernel module.
cloudpickle.register_pickle_by_value(_probe)

_log = logging.getLogger("dkernel.engine")

# client id -> the workers already found to match, so the estimators' own
# connect() inside a CLI command does not ask the workers again
_checked: dict[str, frozenset[str]] = {}


def worker_versions(client: Any) -> dict[str, dict[str, str | None]]:
    """``{worker address: {package: version or None}}`` for :data:`PACKAGES`,
    as each worker's own imports report them.  A worker lost during the check
    (its connection closed) is left out, and named in the log: it was reported
    as one that runs another dkernel, and --upload-package restarted them all."""
    replies = client.run(_probe.package_versions, list(PACKAGES), on_error="return")
    out = {}
    for w, r in replies.items():
        if isinstance(r, (OSError, TimeoutError)):  # (distributed's CommClosedError too)
            _log.warning("worker %s was lost during the version check (%s); left out",
                         w, type(r).__name__)
        else:
            out[w] = r if isinstance(r, dict) else {"dkernel": f"unknown ({type(r).__name__}: {r})"}
    return out


def _dkernel_mismatches(mine: dict[str, str | None],
                        theirs: dict[str, dict[str, str | None]]) -> list[str]:
    """The workers whose dkernel differs from this client's or is missing, or
    that lack one of the other packages."""
    return sorted(w for w, v in theirs.items()
                  if v.get("dkernel") != mine["dkernel"]
                  or any(v.get(p, "") is None for p in PACKAGES))


def refusal(mine: dict[str, str | None], theirs: dict[str, dict[str, str | None]],
            bad: list[str]) -> str:
    """One line: the first bad worker, what it runs, what this client runs, and the fix."""
    worker = bad[0]
    v = theirs[worker]
    others = f" ({len(bad)} of {len(theirs)} workers differ)" if len(bad) > 1 else ""
    if v.get("dkernel") != mine["dkernel"]:
        what = (f"worker {worker} has no dkernel" if v.get("dkernel") is None else
                f"worker {worker} runs dkernel {v['dkernel']}")
        return (f"{what} and this client dkernel {mine['dkernel']}{others}: install dkernel "
                f"{mine['dkernel']} on the workers (one image or environment for client and "
                "workers, see deploy/README.md), or pass --upload-package "
                "(upload_package=True) to send this client's dkernel to them")
    missing = [p for p in PACKAGES if v.get(p, "") is None]
    return (f"worker {worker} has no {', '.join(missing)} and this client runs "
            + ", ".join(f"{p} {mine[p]}" for p in missing)
            + f"{others}: install the same versions on the workers (see deploy/README.md)")


def _warn_other_versions(mine: dict[str, str | None],
                         theirs: dict[str, dict[str, str | None]]) -> None:
    for p in PACKAGES[1:]:
        differ = sorted(w for w, v in theirs.items() if v.get(p) != mine[p])
        if differ:
            _log.warning("worker %s runs %s %s and this client %s %s%s; install the same "
                         "versions on client and workers (results may differ otherwise)",
                         differ[0], p, theirs[differ[0]].get(p), p, mine[p],
                         f" ({len(differ)} of {len(theirs)} workers differ)"
                         if len(differ) > 1 else "")


def upload_package(client: Any, timeout: float = UPLOAD_TIMEOUT) -> None:
    """Send this client's dkernel package to every worker (distributed's
    ``UploadDirectory`` nanny plugin) and wait until the restarted workers
    import it.  Workers need a nanny (``dask worker`` has one unless
    ``--no-nanny``); a worker that joins later gets it too."""
    from distributed.diagnostics.plugin import UploadDirectory

    n_workers = len(client.nthreads())
    version = __version__
    with tempfile.TemporaryDirectory() as tmp:
        # the plugin puts this folder on sys.path, so dkernel/ must sit inside it
        folder = Path(tmp) / f"dkernel-{version}"
        shutil.copytree(Path(__file__).resolve().parents[1], folder / "dkernel",
                        ignore=shutil.ignore_patterns("__pycache__"))
        client.register_plugin(UploadDirectory(str(folder), restart_workers=True,
                                               update_path=True))
    deadline = time.monotonic() + timeout
    while True:
        theirs = worker_versions(client)
        if len(theirs) >= n_workers and all(v.get("dkernel") == version
                                            for v in theirs.values()):
            return
        if time.monotonic() > deadline:
            return  # check_workers says which worker still differs
        time.sleep(0.5)


def check_workers(client: Any, upload: bool = False) -> None:
    """Refuse a cluster whose workers run another dkernel (or none), in one
    line naming the worker and both versions; warn when dask, distributed,
    NumPy or zarr differ.  ``upload``: send this client's dkernel to the
    workers first (:func:`upload_package`) when theirs differs."""
    workers = frozenset(client.nthreads())
    if _checked.get(client.id) == workers:
        return
    mine = _probe.package_versions(list(PACKAGES))
    theirs = worker_versions(client)
    bad = _dkernel_mismatches(mine, theirs)
    if bad and upload:
        upload_package(client)
        theirs = worker_versions(client)
        bad = _dkernel_mismatches(mine, theirs)
    if bad:
        raise RuntimeError(refusal(mine, theirs, bad))
    _warn_other_versions(mine, theirs)
    _checked[client.id] = frozenset(theirs)
