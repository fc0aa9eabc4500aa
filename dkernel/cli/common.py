"""What the commands share: help formatting, output flags (``--json``,
``--quiet``, ``--overwrite``) and the overwrite policy (one flag name per
idea, docs/design.md §1)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Shows every option's default after its help, unless the help says it
    already: a switch is "off" until given, an option without a value "not set"."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if "default" in text or not action.option_strings or action.required:
            return text
        if action.nargs == 0:  # a switch: store_true / store_false / --x/--no-x
            if action.default in (None, False, argparse.SUPPRESS):
                return text + " (default: off)"
            return text + " (default: on)"
        if action.default in (None, argparse.SUPPRESS):
            return text + " (default: not set)"
        return text + " (default: %(default)s)"


def add_command(
    sub: argparse._SubParsersAction, name: str, summary: str, description: str | None = None
) -> argparse.ArgumentParser:
    """A sub-command with the shared help formatter; ``summary`` is its line in
    ``dkernel --help``, ``description`` (default: the summary) heads its own help."""
    return sub.add_parser(
        name,
        help=summary,
        description=description or summary[0].upper() + summary[1:] + ".",
        formatter_class=HelpFormatter,
        allow_abbrev=False,  # --feat 256 must not pass for --features 256
    )


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--scheduler",
        metavar="ADDR",
        help="Dask scheduler address (tcp://host:8786); default: $DASK_SCHEDULER_ADDRESS, "
        "else scheduler-address in the Dask configuration, else a new LocalCluster",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=None,
        help="worker processes of the embedded LocalCluster (default: one per core)",
    )

    p.add_argument(
        "--upload-package",
        dest="upload_package",
        action="store_true",
        help="send this client's dkernel to the workers of --scheduler when theirs differs "
        "(distributed's UploadDirectory plugin; the workers restart), instead of refusing them",
    )
    # Certificates for a tls:// scheduler; without them the Dask configuration's
    # (DASK_DISTRIBUTED__COMM__TLS__*) apply, see deploy/README.md.
    p.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate of a tls:// scheduler")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate for a tls:// scheduler")
    p.add_argument("--tls-key", metavar="PEM", help="client private key for a tls:// scheduler")


def given_cluster_flags(args: argparse.Namespace) -> list[str]:
    """The cluster flags (:func:`add_cluster_args`) given on the command line."""
    return [flag for flag, value in (("--scheduler", args.scheduler), ("--workers", args.workers),
                                     ("--upload-package", args.upload_package or None),
                                     ("--tls-ca-file", args.tls_ca_file),
                                     ("--tls-cert", args.tls_cert), ("--tls-key", args.tls_key))
            if value is not None]


def cluster_options(args: argparse.Namespace) -> dict:
    """Keyword arguments of :func:`dkernel.engine.connect` from the cluster flags."""
    from dkernel.engine.cluster import configured_scheduler, make_security

    address = args.scheduler or configured_scheduler()
    if args.workers is not None and args.workers < 1:
        raise ValueError(f"--workers must be at least 1, got {args.workers}")
    if args.workers is not None and address:
        raise ValueError(f"--workers sizes the embedded LocalCluster; the cluster at {address} "
                         "runs the job on its own workers: drop --workers")
    tls = [f for f in given_cluster_flags(args) if f.startswith("--tls")]
    if tls and not address:
        raise ValueError(f"{', '.join(tls)} apply to a tls:// scheduler: pass --scheduler "
                         "tls://HOST:PORT (or set DASK_SCHEDULER_ADDRESS)")
    if args.upload_package and not address:
        raise ValueError("--upload-package sends dkernel to the workers of a cluster at "
                         "--scheduler; the embedded LocalCluster runs this dkernel already: "
                         "drop it or pass --scheduler tcp://HOST:PORT")
    # (a command has no current client to prefer: the configuration's address is its own)
    return {"scheduler": address, "n_workers": args.workers,
            "upload_package": args.upload_package,
            "security": make_security(args.tls_ca_file, args.tls_cert, args.tls_key)}


def add_output_args(
    p: argparse.ArgumentParser, *, json_output: bool = True, overwrite: bool = False
) -> None:
    """``--quiet`` everywhere; ``--json`` where the command prints numbers;
    ``--overwrite`` where it writes files."""
    p.add_argument(
        "--quiet",
        action="store_true",
        help="no progress or status lines on stderr (results still go to stdout)",
    )
    if json_output:
        p.add_argument("--json", action="store_true", help="print the result as one JSON object")
    if overwrite:
        p.add_argument("--overwrite", action="store_true", help="replace an existing output")


def check_output(path: str, overwrite: bool, flag: str = "--out", store: bool = False,
                 model: bool = False) -> None:
    """The overwrite policy of every command that writes: an existing output is
    refused unless ``--overwrite`` is given (checked before any work); a
    ``store`` output is replaced only if it is a store (or an empty folder), a
    ``model`` output only if it is a model file.  And its folder must take a
    file (:func:`check_writable`)."""
    check_writable(path, flag)
    if overwrite:
        if store and "://" not in path.removeprefix("file://"):
            from dkernel.data.store import check_replaceable

            check_replaceable(path)
        if model:
            _check_model_replaceable(path, flag)
        return
    if "://" in path and not path.startswith("file://"):
        import fsspec

        fs, root = fsspec.core.url_to_fs(path)
        exists = fs.exists(root)
    else:
        exists = os.path.exists(path.removeprefix("file://"))
    if exists:
        raise FileExistsError(
            f"{flag} {path!r} already exists; pass --overwrite to replace it or choose another path"
        )


def check_writable(path: str, flag: str) -> None:
    """Refuse a local output whose folder (or the nearest one that exists, the
    rest being made) takes no file, before any work: a read-only mount or a
    full disk failed only once the fit was done, naming a temporary file."""
    if "://" in path.removeprefix("file://"):
        _check_writable_url(path, flag)
        return
    folder = os.path.dirname(os.path.abspath(path.removeprefix("file://")))
    while not os.path.exists(folder) and os.path.dirname(folder) != folder:
        folder = os.path.dirname(folder)
    if not os.path.isdir(folder):
        raise NotADirectoryError(f"{flag} {path!r} cannot be written: {folder!r} is a file, "
                                 "not a folder; choose another path")
    try:
        fd, probe = tempfile.mkstemp(prefix=".dkernel-probe-", dir=folder)
    except OSError as e:
        raise PermissionError(f"{flag} {path!r} cannot be written ({folder}: "
                              f"{e.strerror}); choose another path") from None
    os.close(fd)
    os.unlink(probe)


def _check_writable_url(url: str, flag: str) -> None:
    """A URL output takes an object, probed by writing and removing one beside it
    (a missing bucket failed only once the fit was done); memory:// is refused,
    since it is gone when the command's process ends."""
    import posixpath
    import uuid

    from dkernel.files import url_fs

    if url.split("::")[-1].startswith("memory://"):
        raise ValueError(f"{flag} {url!r}: memory:// holds data only in the process that "
                         "writes it, and a command's output must outlive the command; write "
                         "to a path or to an object store such as s3://")
    fs, root = url_fs(url)
    probe = posixpath.join(posixpath.dirname(root.rstrip("/")),
                           f".dkernel-probe-{uuid.uuid4().hex}")
    try:
        fs.pipe_file(probe, b"")
        fs.rm_file(probe)
    except Exception as e:  # (botocore, gcsfs, ...: each has its own types)
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise PermissionError(f"{flag} {url!r} cannot be written ({reason}); check the bucket "
                              "and the credentials, or choose another path") from None


def _check_model_replaceable(path: str, flag: str) -> None:
    """Refuse ``--overwrite`` of an existing file that is not a dkernel model."""
    from dkernel.files import NewerFormatError, file_exists, read_npz_meta

    if not file_exists(path):
        return
    try:
        kind = read_npz_meta(path).get("kind")
    except NewerFormatError:
        raise
    except ValueError:  # not a dkernel file (an unreadable one says so itself)
        kind = None
    if kind != "model":
        raise FileExistsError(f"{flag} {path!r} exists and is not a dkernel model file; "
                              "--overwrite replaces only a model written before: remove it "
                              "yourself or choose another path")


def status(args: argparse.Namespace, message: str) -> None:
    """A status line on stderr, unless ``--quiet``."""
    if not getattr(args, "quiet", False):
        print(message, file=sys.stderr, flush=True)


def emit(args: argparse.Namespace, result: dict[str, Any], text: list[str] | None = None) -> None:
    """The command's result on stdout: one JSON object with ``--json``, else
    ``text`` (default: ``key: value`` lines)."""
    if getattr(args, "json", False):
        print(json.dumps(result, default=str))
        return
    if text is None:
        text = [f"{k}: {_show(v)}" for k, v in result.items()]
    for line in text:
        print(line)


def _show(v: Any) -> str:
    if isinstance(v, float):  # all its digits: a value copied back must be the same
        return repr(v)
    if isinstance(v, list) and all(isinstance(x, float) for x in v):
        return " ".join(f"{x:.4g}" for x in v)
    if isinstance(v, (dict, list)):
        return json.dumps(v, default=str)
    return str(v)


@contextmanager
def connect_cluster(args: argparse.Namespace) -> Iterator[Any]:
    """:func:`dkernel.engine.connect` as the command's cluster flags say,
    yielding the client; unless --quiet, a line names the command after each
    10 s in which nothing printed a progress line (a cluster's start, a client's
    eigensolve: :func:`dkernel.engine.progress.phase`)."""
    from dkernel.engine import connect
    from dkernel.engine.progress import phase

    command = " ".join(["dkernel", *([args.command] if getattr(args, "command", None) else [])])
    with phase(command, not getattr(args, "quiet", False)), \
            connect(**cluster_options(args)) as client:
        yield client


def cluster_job(p: argparse.ArgumentParser, func: Any, *, overwrite: bool = True,
                **defaults: Any) -> None:
    """End a command that runs on a Dask cluster: its output flags (``--quiet``,
    ``--json``, ``--overwrite`` unless it writes nothing), the cluster flags,
    and ``func``, which runs it (``defaults``: more parsed values)."""
    add_output_args(p, overwrite=overwrite)
    add_cluster_args(p)
    p.set_defaults(func=func, **defaults)
