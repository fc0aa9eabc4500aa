"""Atomic checkpoints of a solver's state and resume with a compatibility check."""

from __future__ import annotations

import math
import os
import warnings
from typing import Any

import numpy as np

from dkernel._stack import user_stacklevel
from dkernel.engine._probe import package_versions
from dkernel.files import (
    NewerFormatError,
    file_exists,
    read_npz,
    read_npz_meta,
    user_path,
    write_npz_atomic,
)

#: What a checkpoint or model file records as the software that wrote it
#: (``dkernel info`` shows it).
WRITERS = ("dkernel", "numpy", "dask", "distributed")


def writer_versions() -> dict[str, str | None]:
    """``{package: version}`` of :data:`WRITERS` in this process."""
    return package_versions(list(WRITERS))


def split_state(state: dict[str, Any]) -> tuple[dict[str, np.ndarray], dict[str, Any]]:
    """Arrays go to the npz, JSON-able scalars to the metadata."""
    arrays, scalars = {}, {}
    for k, v in state.items():
        if isinstance(v, np.ndarray):
            arrays[k] = v
        elif isinstance(v, np.generic):
            scalars[k] = v.item()
        else:
            scalars[k] = v
    return arrays, scalars


#: Fingerprint entries a fit computes (an eigensolve, the median heuristic)
#: rather than takes from its settings or data: their floats may differ in
#: the last digits between processes.  A step size derived from a float32
#: eigensolve on the client came out 1.2e-6 apart in a process that also
#: hosts the scheduler (628.47545 against 628.47622), and the resume of such
#: a fit in the other kind of process was refused.
_SOLVED = frozenset({"step_size", "preconditioner", "eta", "bandwidth", "features"})


def _same(a: Any, b: Any, tolerant: bool = False) -> bool:
    """Fingerprint values equal; with ``tolerant`` their floats to 1e-5 relative."""
    if tolerant and (isinstance(a, float) or isinstance(b, float)):
        return (isinstance(a, (int, float)) and isinstance(b, (int, float))
                and math.isclose(a, b, rel_tol=1e-5, abs_tol=1e-12))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], tolerant) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, tolerant) for x, y in zip(a, b))
    return a == b


def not_a_checkpoint(path: str | os.PathLike) -> str | None:
    """Why the file at ``path`` is not a checkpoint (:func:`is_checkpoint`), or
    None where it is one: another kind of dkernel file, or one that cannot be
    read (a damaged checkpoint among them)."""
    try:
        kind = read_npz_meta(path).get("kind")
    except NewerFormatError:
        raise
    except (FileNotFoundError, ValueError) as exc:
        return f"it cannot be read: {exc}"
    return None if kind == "checkpoint" else f"it is a dkernel {kind or 'file of no kind'}"


def is_checkpoint(path: str | os.PathLike) -> bool:
    """Whether ``path`` holds a checkpoint written by :class:`Checkpointer` (a
    model, data or any other file does not); a newer dkernel's raises."""
    return not_a_checkpoint(path) is None


#: The fingerprint's identity of the data (:func:`data_identity`).
DATA = "data"

#: The fingerprint's record of where the feature blocks or kernel rows lived
#: between epochs (float32, fixed16 or off): the model depends on it.
CACHE = "cache"


def saved_setting(path: str | os.PathLike | None, key: str) -> Any:
    """The value ``key`` has in the fingerprint of the checkpoint at ``path``;
    None where there is no checkpoint or it has no such entry."""
    if path is None or not file_exists(path):
        return None
    try:
        meta = read_npz_meta(path)
    except (FileNotFoundError, ValueError):  # (the resume itself says what is wrong)
        return None
    fingerprint = meta.get("fingerprint") if meta.get("kind") == "checkpoint" else None
    return fingerprint.get(key) if isinstance(fingerprint, dict) else None  # (else: damaged)


def _difference(key: str, saved: Any, now: Any) -> str:
    """``key`` with the checkpoint's value and this fit's, where they are short."""
    shown = [repr(v) for v in (saved, now)]
    if max(len(v) for v in shown) > 40:
        return key
    return f"{key}: the checkpoint's {shown[0]}, this fit's {shown[1]}"


def _fix(diff: list[str], saved: dict) -> str:
    """What to resume with; the checkpoint's value for the settings a fit
    resolves from the cluster ("auto")."""
    given = []
    if "lanes" in diff:
        given.append(f"lanes={saved['lanes']} (--lanes {saved['lanes']}; \"auto\" is one "
                     "lane per worker thread)")
    if CACHE in diff:
        given.append(f"feature_cache={saved[CACHE]!r} (kernel_cache for EigenPro's kernel "
                     "form; \"auto\" follows the workers' memory)")
    same = [] if given and set(diff) <= {"lanes", CACHE} else ["the same data and settings"]
    return "resume with " + " and ".join(same + given)


def data_identity(client: Any, data: Any) -> str:
    """A digest of the fit's rows: their shape, dtypes and chunking, and the
    bytes of the first, middle and last chunk of X and y, hashed where they
    are (on a worker for a store or dask input).  A checkpoint of other data
    (another target, columns swapped, another fold) is refused; before, a
    finished checkpoint handed back the other fit's model.  Other chunks
    rewritten in place go unseen (hashing them all is a pass over the store;
    docs/guide/scale.md says so).
    Content, not names: a dask array rebuilt from ``dask.delayed`` loads, or a
    store copied or mounted elsewhere, is the same data."""
    import hashlib

    import dask

    n = data.n_chunks
    picks = sorted({0, n // 2, n - 1})
    if data.host is not None:
        at = data.row_offsets()
        X, y = data.host
        parts = [_digest(X[at[i]:at[i + 1]], None if y is None else y[at[i]:at[i + 1]])
                 for i in picks]
    else:
        parts = client.compute(
            [dask.delayed(_digest)(data.X.blocks[i], None if data.y is None else data.y.blocks[i])
             for i in picks], sync=True)
    shapes = [(a.shape, str(a.dtype)) for a in (data.X, data.y) if a is not None]
    return hashlib.sha1(repr((shapes, data.row_chunks, parts)).encode()).hexdigest()


def _digest(X: Any, y: Any) -> str:
    import hashlib

    h = hashlib.sha1()
    for a in (X, y):
        if a is not None:
            h.update(np.ascontiguousarray(np.asarray(a)).tobytes())
    return h.hexdigest()


class Checkpointer:
    """Writes ``state`` every ``every`` steps to ``path``; reads it back on resume."""

    def __init__(self, path: str | os.PathLike | None, every: int, fingerprint: dict) -> None:
        self.path = None if path is None else user_path(path)
        self.every = int(every or 0)
        self.fingerprint = fingerprint
        why = self.path is not None and file_exists(self.path) and not_a_checkpoint(self.path)
        if why:  # the fit's checkpoints would be written over it
            raise FileExistsError(
                f"checkpoint {self.path!r} exists and is not a checkpoint ({why}); name another "
                "file for checkpoint, or remove a damaged one")

    def due(self, step: int) -> bool:
        return self.path is not None and self.every > 0 and step % self.every == 0

    def save(self, state: dict[str, Any], step: int) -> None:
        arrays, scalars = split_state(state)
        try:
            write_npz_atomic(self.path, arrays, {"kind": "checkpoint", "step": step,
                                                 "fingerprint": self.fingerprint,
                                                 "scalars": scalars, "every": self.every,
                                                 "versions": writer_versions()})
        except OSError as e:  # (it named a temporary file, or no file: "No space left")
            raise OSError(e.errno, f"checkpoint {self.path!r} could not be written: "
                                   f"{e.strerror or e}; the previous one is kept") from e

    def starting_over(self) -> None:
        """Warn that a fit without ``resume`` will write over an existing
        checkpoint: an interrupted fit's progress went without a word (the
        command line refuses it unless --overwrite is given)."""
        if self.path is not None and self.every > 0 and file_exists(self.path):
            warnings.warn(f"checkpoint {self.path} exists and this fit starts over (resume=False): "
                          "its checkpoints replace it; pass resume=True to continue the fit it "
                          "holds", UserWarning, stacklevel=user_stacklevel())

    def resume(self) -> tuple[dict[str, Any], int] | None:
        """:meth:`load`, with a warning where there is nothing to load: a
        mistyped path restarted a long fit without a word."""
        loaded = self.load()
        if loaded is None:
            warnings.warn(f"resume: no checkpoint at {self.path}; the fit starts from the first "
                          "step", UserWarning, stacklevel=user_stacklevel())
        return loaded

    def load(self) -> tuple[dict[str, Any], int] | None:
        """(state, step) of an existing compatible checkpoint, or None if there is none."""
        if self.path is None or not file_exists(self.path):
            return None
        arrays, meta = read_npz(self.path)
        if meta.get("kind") != "checkpoint":
            raise ValueError(f"{self.path!r} is not a checkpoint")
        parts = {k: meta.get(k) for k in ("fingerprint", "scalars", "step")}
        kinds = {"fingerprint": dict, "scalars": dict, "step": int}
        damaged = [k for k, v in parts.items() if not isinstance(v, kinds[k])]
        if damaged:  # (a bare "dkernel: error: 'fingerprint'" before)
            raise ValueError(f"checkpoint {self.path!r} is damaged (its {', '.join(damaged)} "
                             "cannot be read); delete it to start over")
        old = meta["fingerprint"]
        diff = sorted(k for k in set(old) | set(self.fingerprint)
                      if not _same(old.get(k), self.fingerprint.get(k), k in _SOLVED)
                      # (written before it was recorded)
                      and not (k in (DATA, "step_size", CACHE) and k not in old))
        # (piece_rows: a scan that now cuts its chunks, written before it did)
        if "plan_version" in diff or ("piece_rows" in diff and "piece_rows" not in old):
            raise ValueError(
                f"checkpoint {self.path!r} was written by an older dkernel, whose steps take "
                "other rows; it cannot be resumed: delete it to start over")
        if diff:
            raise ValueError(
                f"checkpoint {self.path!r} belongs to a different fit (differs in: "
                f"{'; '.join(_difference(k, old.get(k), self.fingerprint.get(k)) for k in diff)})"
                f"; {_fix(diff, old)}, or delete the checkpoint to start over")
        if not self.every:
            # resumed with no interval given (``--resume`` alone): go on at the
            # interrupted fit's, or a second interruption lost every step since
            self.every = int(meta.get("every", 0))
        return {**arrays, **meta["scalars"]}, int(meta["step"])
