"""File primitives: dkernel's ``.npz`` files (arrays plus JSON metadata, never
pickle) written atomically, and the local-path / fsspec-URL helpers they use.

This module is the bottom layer: it imports nothing of dkernel, so the engine's
checkpoints and the model files above it share it without import cycles.

A file holds named NumPy arrays and a ``__meta__`` entry (UTF-8 JSON stored
as a uint8 array) with what the caller records (a model's estimator class and
hyper-parameters, a checkpoint's step, the versions that wrote it).  Files
are written to a temporary name in the same folder and renamed into place (on
object stores: a temporary key, verified, then copied onto the final key), so a
reader never sees a half-written file and a failed fit leaves nothing behind.
Paths may be fsspec URLs (``s3://bucket/m.npz``).

Also the stream for advice (:class:`AdviceStream`: progress and warnings on
stderr), which the command line wraps before it imports anything heavy.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import glob
import inspect
import io
import json
import os
import tempfile
import uuid
import zipfile
from collections.abc import Callable
from typing import Any, TextIO

import numpy as np

FORMAT = "dkernel-npz"
FORMAT_VERSION = 1


def user_path(path: str | os.PathLike) -> str:
    """``path`` as a string, a leading ``~`` expanded to the home folder as a
    shell would (a URL is kept as given).  ``model.save("~/m.npz")`` made a
    folder named "~" in the working folder: only the shell expanded it."""
    path = os.fspath(path)
    return os.path.expanduser(path) if path.startswith("~") else path


def expands_user(*names: str) -> Callable:
    """Decorate a public function so that its path arguments ``names`` go
    through :func:`user_path` (None and URLs stay as given)."""
    def wrap(fn: Callable) -> Callable:
        signature = inspect.signature(fn)

        @functools.wraps(fn)
        def call(*args: Any, **kwargs: Any) -> Any:
            bound = signature.bind(*args, **kwargs)
            for name in names:
                value = bound.arguments.get(name)
                if isinstance(value, (str, os.PathLike)):
                    bound.arguments[name] = user_path(value)
            return fn(*bound.args, **bound.kwargs)
        return call
    return wrap


def is_url(path: str | os.PathLike) -> bool:
    """Whether ``path`` names an object in an fsspec file system (``s3://``,
    ``gs://``, ``memory://``, ...) rather than a local file."""
    path = os.fspath(path)
    return "://" in path and not path.startswith("file://")


def url_fs(path: str, **storage_options: Any) -> tuple[Any, str]:
    """The fsspec file system and in-file-system path of a URL.  Credentials
    and endpoints come from the environment (``AWS_ACCESS_KEY_ID``,
    ``AWS_SECRET_ACCESS_KEY``, ``AWS_ENDPOINT_URL``, ...), never from dkernel."""
    import fsspec

    require_protocol(path)
    return fsspec.core.url_to_fs(path, **storage_options)


#: URL schemes whose fsspec file system a dkernel extra installs
_PROTOCOL_EXTRAS = {"s3": "s3", "s3a": "s3"}


def require_protocol(path: str | os.PathLike) -> None:
    """Stop with one line naming what to install when the file system of a URL's
    scheme is missing (fsspec alone says "Install s3fs to access S3", deep in
    whatever opened the URL)."""
    path = os.fspath(path)
    if not is_url(path):
        return
    import fsspec

    # a chained URL (simplecache::s3://bucket/key) names one file system a link
    for link in path.split("::"):
        protocol = link.split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except ImportError as exc:
            extra = _PROTOCOL_EXTRAS.get(protocol)
            fix = (f"pip install 'dkernel[{extra}]'" if extra
                   else f"install the fsspec file system for {protocol}://")
            raise ModuleNotFoundError(f"{protocol}:// URLs need a package that is not installed "
                                      f"here ({exc}): {fix}", name=protocol) from None
        except ValueError:
            raise ValueError(f"{path!r}: fsspec knows no file system for {protocol}://; use a "
                             "local path or a URL such as s3://bucket/key") from None


def file_exists(path: str | os.PathLike) -> bool:
    """Whether a model / checkpoint file exists at a local path or URL."""
    path = user_path(path)
    if is_url(path):
        fs, key = url_fs(path)
        fs.invalidate_cache()  # another process may have written or removed it
        return bool(fs.isfile(key))
    return os.path.isfile(path.removeprefix("file://"))


def remove_file(path: str | os.PathLike) -> None:
    """Remove a model / checkpoint file (local path or URL) if it exists, and
    the temporary files of its writes that a killed process left beside it
    (``.tmp-<random>-NAME``, :func:`write_npz_atomic`): a fit killed during a
    checkpoint's upload left one in the bucket for good."""
    path = user_path(path)
    if is_url(path):
        fs, key = url_fs(path)
        if file_exists(path):
            fs.rm_file(key)
        parent, _, name = key.rstrip("/").rpartition("/")
        for stale in fs.glob(f"{parent}/.tmp-{'?' * 12}-{glob.escape(name)}"):  # uuid hex
            fs.rm_file(stale)
        return
    path = path.removeprefix("file://")
    if os.path.exists(path):
        os.unlink(path)
    folder, name = os.path.split(os.path.abspath(path))
    # mkstemp's 8 random characters (no "-": another file's temporaries never match)
    pattern = f".tmp-{'?' * 8}-{glob.escape(name)}"
    for stale in glob.glob(os.path.join(glob.escape(folder), pattern)):
        os.unlink(stale)


def local_target(path: str) -> str:
    """``path``, or where the symbolic link at ``path`` points: outputs are
    written beside their path and renamed onto it, which replaced the link
    itself (an overwritten store failed after its whole write; a dangling
    link read as "another run wrote here")."""
    return os.path.realpath(path) if os.path.islink(path) else path


def _npz_bytes(arrays: dict[str, np.ndarray], meta: dict) -> bytes:
    meta = {"format": FORMAT, "format_version": FORMAT_VERSION, **meta}
    blob = np.frombuffer(json.dumps(meta, sort_keys=True).encode(), dtype=np.uint8)
    for key in arrays:
        if key == "__meta__":
            raise ValueError("'__meta__' is reserved")
    buf = io.BytesIO()
    np.savez(buf, __meta__=blob, **{k: np.asarray(v) for k, v in arrays.items()})
    return buf.getvalue()


def write_npz_atomic(path: str | os.PathLike, arrays: dict[str, np.ndarray], meta: dict, *,
                     exclusive: bool = False) -> None:
    """Write arrays + JSON meta to ``path`` atomically; a reader sees the old
    file or the new one, never a half-written one.  ``exclusive``: never
    replace a file at ``path`` -- one another writer made while this one
    worked is kept and this write fails (FileExistsError); for a local path
    the commit is a hard link, which the kernel refuses onto an existing name.

    Local paths: a temporary file in the same folder, fsync, rename.

    URLs (``s3://...``): the bytes are uploaded to a temporary key beside
    ``path``, read back and compared, and only then copied onto ``path`` by
    the store (S3 CopyObject) and the temporary key removed.  An S3 object
    becomes visible only once its upload completes, so ``path`` always holds
    a complete, verified file: the previous checkpoint until the new one is
    known good, then the new one.  (A bucket has no rename; the copy is the
    commit.)
    """
    path = user_path(path)
    if not is_url(path) and os.path.isdir(path):  # (the rename's error named the temp file)
        raise IsADirectoryError(f"{path!r} is a folder; give a file path such as "
                                f"{os.path.join(path, 'model.npz')!r}")
    data = _npz_bytes(arrays, meta)
    if is_url(path):
        fs, key = url_fs(path)
        parent, _, name = key.rstrip("/").rpartition("/")
        tmp = f"{parent}/.tmp-{uuid.uuid4().hex[:12]}-{name}"
        try:
            fs.pipe_file(tmp, data)
            if fs.cat_file(tmp) != data:
                raise OSError(f"the upload of {path!r} read back differently; not committed")
            if exclusive and fs.exists(key):  # (a bucket has no exclusive copy: checked last)
                raise _appeared(path)
            fs.copy(tmp, key)
        finally:
            try:
                fs.rm_file(tmp)
            except FileNotFoundError:
                pass
        return
    path = local_target(path.removeprefix("file://"))
    folder = os.path.dirname(os.path.abspath(path))
    os.makedirs(folder, exist_ok=True)
    # named after the file, so that removing the file finds what a killed write left
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=f"-{os.path.basename(path)}", dir=folder)
    try:
        # mkstemp's file is 0600; a model is a file like any other (readable by the
        # pods and users the umask lets read it), so it gets open()'s mode -- or,
        # replacing a file, that file's own (an operator's chmod 0640 is kept)
        try:
            mode = os.stat(path).st_mode & 0o7777
        except FileNotFoundError:
            mode = 0o666 & ~_umask()
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        if not exclusive:
            os.replace(tmp, path)
        else:
            try:
                os.link(tmp, path)
            except FileExistsError:
                raise _appeared(path) from None
            except OSError as e:
                if e.errno not in _NO_HARD_LINKS:
                    raise
                # FAT, SMB without unix extensions, most FUSE mounts: checked, then
                # renamed (the race a bucket has too), rather than no model at all
                if os.path.exists(path):
                    raise _appeared(path) from None
                os.replace(tmp, path)
            else:
                os.unlink(tmp)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


#: errno of a filesystem that makes no hard links (:func:`write_npz_atomic`).
_NO_HARD_LINKS = {errno.EPERM, errno.EOPNOTSUPP, errno.ENOTSUP, errno.ENOSYS, errno.EXDEV,
                  errno.EMLINK}


def _appeared(path: str) -> FileExistsError:
    return FileExistsError(f"{path!r} appeared while this output was written (another run "
                           "writing the same path?); it was kept: remove it or choose another "
                           "output path")


def _umask() -> int:
    """The process's umask, read without changing it where Linux shows it (setting
    and restoring it would briefly give files made by other threads mode 0666)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


class NewerFormatError(ValueError):
    """A dkernel file of a format version this dkernel does not know."""


def read_npz(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict]:
    """Arrays and metadata of a file written by :func:`write_npz_atomic`."""
    return _read_npz(path, arrays=True)


def read_npz_meta(path: str | os.PathLike) -> dict:
    """The metadata of a file written by :func:`write_npz_atomic`, without
    reading its arrays (from an object store: the zip's directory and one
    member, not the whole file)."""
    return _read_npz(path, arrays=False)[1]


def read_npz_shapes(path: str | os.PathLike) -> dict[str, tuple[tuple, str]]:
    """``{array: (shape, dtype)}`` of a file written by :func:`write_npz_atomic`,
    from each member's header: nothing is unpacked (``dkernel info``)."""
    path = user_path(path)
    read_npz_meta(path)  # (the checks: a dkernel file, not a newer format)
    with contextlib.ExitStack() as stack:
        if is_url(path):
            fs, key = url_fs(path)
            source: Any = stack.enter_context(fs.open(key, "rb"))
        else:
            source = stack.enter_context(open(path.removeprefix("file://"), "rb"))
        archive = stack.enter_context(zipfile.ZipFile(source))
        shapes = {}
        for name in archive.namelist():
            if name == "__meta__.npy" or not name.endswith(".npy"):
                continue
            with archive.open(name) as member:
                version = np.lib.format.read_magic(member)
                read = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                        else np.lib.format.read_array_header_2_0)
                shape, _, dtype = read(member)
            shapes[name[:-4]] = (tuple(shape), str(dtype))
    return shapes


#: A member that unpacks to more than this many times its stored bytes (and
#: more than :data:`_INFLATED_BYTES`) is refused: dkernel stores its arrays
#: uncompressed (np.savez), and a 1.4 MB file that unpacked to 1.5 GB of zeros
#: took that much memory to load, or to be described by ``dkernel info``.
_INFLATION = 100
_INFLATED_BYTES = 16 << 20


def _check_inflation(source: Any, path: str) -> None:
    try:
        with zipfile.ZipFile(source) as archive:
            for member in archive.infolist():
                if member.file_size > max(_INFLATED_BYTES, _INFLATION * member.compress_size):
                    raise ValueError(
                        f"{path!r} is not a file dkernel wrote: its member "
                        f"{member.filename!r} unpacks to {member.file_size / 2**20:.0f} MB "
                        f"from {member.compress_size / 2**20:.1f} MB (dkernel stores arrays "
                        "uncompressed)")
    finally:  # (np.load reads it next: a truncated zip said "No data left in file")
        source.seek(0)


def _read_npz(path: str | os.PathLike, arrays: bool) -> tuple[dict[str, np.ndarray], dict]:
    path = user_path(path)
    if not file_exists(path):
        raise FileNotFoundError(f"no model or checkpoint file at {path!r}")
    with contextlib.ExitStack() as stack:
        if is_url(path):
            fs, key = url_fs(path)
            source: Any = (io.BytesIO(fs.cat_file(key)) if arrays
                           else stack.enter_context(fs.open(key, "rb")))
        else:
            source = stack.enter_context(open(path.removeprefix("file://"), "rb"))
        head = source.read(4)
        source.seek(0)
        if head != b"PK\x03\x04":
            # np.load would try it as a pickle and advise allow_pickle=True, which
            # dkernel never uses (docs/design.md §1: never pickle)
            raise ValueError(f"{path!r} is not a dkernel model or checkpoint: those are .npz "
                             "archives written by 'dkernel fit --out' or save_model()")
        try:
            _check_inflation(source, path)
        except zipfile.BadZipFile:
            pass  # (np.load says what is wrong, below)
        try:
            with np.load(source, allow_pickle=False) as z:
                if "__meta__" not in z.files:
                    raise ValueError("no metadata")
                blob = z["__meta__"]
                loaded = {k: z[k] for k in z.files if k != "__meta__"} if arrays else {}
        except Exception as exc:
            raise ValueError(f"{path!r} is not a dkernel file ({exc})") from None
    try:
        meta = json.loads(blob.tobytes().decode())
        if not isinstance(meta, dict):
            raise ValueError(f"metadata is a {type(meta).__name__}, not an object")
    except ValueError as exc:  # (UnicodeDecodeError and JSONDecodeError are ValueErrors)
        raise ValueError(f"{path!r} is not a dkernel file: its metadata cannot be read "
                         f"({exc})") from None
    if meta.get("format") != FORMAT:
        raise ValueError(f"{path!r} is not a dkernel file (format {meta.get('format')!r})")
    version = meta.get("format_version", 0)
    if not isinstance(version, int):
        raise ValueError(f"{path!r} is not a dkernel file (format_version {version!r})")
    if version > FORMAT_VERSION:
        raise NewerFormatError(f"{path!r} was written by a newer dkernel (format "
                               f"{meta['format_version']}); upgrade dkernel")
    return loaded, meta


class AdviceStream:
    """A stream for advice (progress, warnings): once it is gone -- its reader
    gone (``2>&1 | head -1``), its descriptor closed (``2>&-``) -- every later
    write is dropped, and the work goes on.  A fit died of the first failed
    progress line, before its model was written.  A write that fails otherwise
    (a full non-blocking pipe) drops that line only.  ``null``: point a gone
    stream's descriptor at /dev/null (a process's own stderr: the flush at exit
    would meet the broken pipe again)."""

    def __init__(self, stream: TextIO | None, null: bool = False) -> None:
        self.stream, self.dead, self.null = stream, stream is None, null

    def _failed(self, err: Exception) -> None:
        if isinstance(err, ValueError) or getattr(err, "errno", None) in (errno.EPIPE,
                                                                          errno.EBADF):
            self.dead = True
            if self.null:
                to_devnull(self.stream)

    def write(self, text: str) -> int:
        if not self.dead:
            try:
                return self.stream.write(text)  # type: ignore[union-attr]
            except (OSError, ValueError) as err:  # (ValueError: a closed file)
                self._failed(err)
        return len(text)

    def flush(self) -> None:
        if not self.dead:
            try:
                self.stream.flush()  # type: ignore[union-attr]
            except (OSError, ValueError) as err:
                self._failed(err)

    def isatty(self) -> bool:
        try:
            return not self.dead and bool(self.stream.isatty())  # type: ignore[union-attr]
        except (OSError, ValueError):
            return False

    def __getattr__(self, name: str) -> Any:  # (fileno, encoding, ...)
        return getattr(self.stream, name)


def to_devnull(stream: Any) -> None:
    """Point a dead stream's descriptor at /dev/null: the interpreter's flush at
    exit would meet the broken pipe again (and exit 120)."""
    import os

    try:
        null = os.open(os.devnull, os.O_WRONLY)
        os.dup2(null, stream.fileno())
        os.close(null)
    except (AttributeError, OSError, ValueError):
        pass
