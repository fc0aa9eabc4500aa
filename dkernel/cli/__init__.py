"""``dkernel`` command line: ingest / fit / predict / transform / evaluate / info / demo.

Errors print one line on stderr and exit non-zero; ``--debug`` shows the traceback.
"""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import signal
import sys
import threading
import warnings

from dkernel.files import AdviceStream, to_devnull, user_path

# One module per command family; each exposes register(subparsers).
_COMMANDS = ("ingest", "make_store", "fit", "predict", "info", "plot", "demo")

_DESCRIPTION = ("dkernel: kernel methods on Dask. Convert data into a zarr dataset store "
                "(ingest) or write a synthetic one of any size on the workers (make-store), "
                "train a model (fit), apply it (predict, transform, evaluate), "
                "describe stores and models (info), draw a model's learning curve (plot), "
                "or run everything on synthetic data (demo).")
_EPILOG = ("Errors print one line on stderr and exit non-zero; --debug shows the traceback. "
           "An existing output is never replaced without --overwrite. "
           "'dkernel COMMAND --help' lists a command's options and their defaults.")


def build_parser() -> argparse.ArgumentParser:
    from dkernel import __version__
    from dkernel.cli.common import HelpFormatter

    parser = argparse.ArgumentParser(prog="dkernel", description=_DESCRIPTION, epilog=_EPILOG,
                                     formatter_class=HelpFormatter, allow_abbrev=False)
    parser.add_argument("--version", action="version", version=f"dkernel {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    sub.required = True
    for name in _COMMANDS:
        try:
            module = importlib.import_module(f"dkernel.cli.{name}")
        except ModuleNotFoundError as exc:
            if exc.name != f"dkernel.cli.{name}":
                raise
            continue
        module.register(sub)
    return parser


class _Terminated(KeyboardInterrupt):
    """SIGTERM (what ``timeout``, Slurm and Kubernetes send): unwound as Ctrl-C
    is, so temporary stores are removed and a resumable fit keeps its checkpoint."""


def _interrupted(signum: int, frame: object) -> None:
    # Ctrl-C cuts short the client's pending gathers; as the client closes,
    # each would log "Task exception was never retrieved" under the one line
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)
    raise _Terminated if signum == signal.SIGTERM else KeyboardInterrupt


def _reader_gone(stream: object) -> bool:
    """Whether ``stream`` is a pipe whose reader has gone (poll: POLLERR)."""
    import select

    try:
        poll = select.poll()
        poll.register(stream.fileno(), select.POLLOUT)  # type: ignore[attr-defined]
        return any(ev & (select.POLLERR | select.POLLHUP) for _, ev in poll.poll(0))
    except (AttributeError, OSError, ValueError):
        return False


def _one_line_warning(message: Warning | str, category: type[Warning], filename: str,
                      lineno: int, line: str | None = None) -> str:
    text = str(message).strip().splitlines()[0] if str(message).strip() else ""
    return f"dkernel: warning: {category.__name__}: {text}\n"


class _OneLineLog(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage().strip().splitlines()
        return f"dkernel: {record.levelname.lower()}: {text[0] if text else ''}"


def _only_critical(record: logging.LogRecord) -> bool:
    return record.levelno >= logging.CRITICAL


def _scheduler_lost(exc: BaseException) -> bool:
    """Whether ``exc`` is distributed's word that the scheduler went away
    mid-command (it said "Timed out trying to connect", and nothing of why)."""
    from distributed.comm.core import CommClosedError

    from dkernel.engine.cluster import SchedulerUnreachable

    if isinstance(exc, SchedulerUnreachable):  # never reached: not lost
        return False
    return isinstance(exc, CommClosedError) or (
        isinstance(exc, OSError) and "Timed out trying to connect" in str(exc))


#: Seconds an interrupted command's exit may wait for threads before it is forced.
EXIT_GRACE = 10.0


def entry() -> None:
    """The ``dkernel`` program: :func:`main`, and a process that says nothing of
    what it cannot clean up at exit (without --debug): an unreachable object
    store left ~100 lines of "Exception ignored in: <coroutine FsspecStore.get>"
    under the one-line error."""
    if "--debug" not in sys.argv[1:]:
        sys.unraisablehook = lambda unraisable: None
    code = main()
    if code in (130, 143):  # zarr's writes cut short are collected at exit, each a warning
        warnings.filterwarnings("ignore", "coroutine .* was never awaited", RuntimeWarning)
        # A thread the command could not stop (the in-process scheduler building a graph
        # of 200,000 chunks) held the exit for minutes after "dkernel: terminated", and a
        # batch system then escalates to SIGKILL: exit anyway after a grace period
        for stream in (sys.stdout, sys.stderr):
            if stream is not None:
                stream.flush()
        timer = threading.Timer(EXIT_GRACE, os._exit, args=(code,))
        timer.daemon = True
        timer.start()
    sys.exit(code)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        parser = build_parser()
    except ValueError as exc:  # importing dask reads the user's configuration files
        if "dask config file" not in str(exc):
            raise
        # (53 lines of traceback, for --help too); dask names the file
        print(f"dkernel: error: {' '.join(str(exc).split())}; fix or remove that file",
              file=sys.stderr)
        return 1
    args = parser.parse_args(argv)
    for name, value in vars(args).items():  # "--out=~/m.npz" reaches us unexpanded: it
        if isinstance(value, str) and value.startswith("~/"):  # made a folder named "~"
            setattr(args, name, user_path(value))  # (the Python API's rule)
    args.argv = argv  # the spelling of each option given (dkernel fit names aliases as typed)
    in_main = threading.current_thread() is threading.main_thread()
    # (a signal ignored on entry stays ignored: a shell's background job ignores SIGINT)
    previous = ({sig: signal.signal(sig, _interrupted) for sig in (signal.SIGINT, signal.SIGTERM)
                 if signal.getsignal(sig) is not signal.SIG_IGN} if in_main else {})
    formatwarning, asyncio_level = warnings.formatwarning, logging.getLogger("asyncio").level
    # progress and warnings are advice: a reader gone (`2>&1 | head -1`) or a
    # closed stderr stopped the fit before its model was written
    stderr, sys.stderr = sys.stderr, AdviceStream(sys.stderr, null=True)
    # the engine's logged warnings (no workers yet, a worker's other numpy) in
    # the same one-line form as warnings.warn's, not Python's bare last resort
    log_handler = logging.StreamHandler(sys.stderr)
    log_handler.setLevel(logging.WARNING)
    log_handler.setFormatter(_OneLineLog())
    logging.getLogger("dkernel").addHandler(log_handler)
    # a fit stopped after its workers were lost leaves distributed's cancelled
    # gathers behind ("Task exception was never retrieved", a traceback each), and
    # a lost scheduler has distributed's client log a 30-line traceback before the
    # command's own one-line error; --debug keeps both
    # (a filter, not a level: importing distributed sets its loggers' levels)
    quieted = [logging.getLogger(name) for name in ("asyncio", "distributed.client")]
    if not args.debug:  # a printed warning is one line too, without Python's source lines
        warnings.formatwarning = _one_line_warning
        for log in quieted:
            log.addFilter(_only_critical)
    try:
        result = args.func(args)
        if sys.stdout is not None:  # (a reader gone shows here, not at exit: rc 120)
            sys.stdout.flush()
        return int(result or 0)
    except KeyboardInterrupt as exc:
        terminated = isinstance(exc, _Terminated)
        print(f"dkernel: {'terminated' if terminated else 'interrupted'}", file=sys.stderr)
        return 143 if terminated else 130
    except Exception as exc:  # one clear line for people; --debug for developers
        if isinstance(exc, BrokenPipeError) and _reader_gone(sys.stdout):
            to_devnull(sys.stdout)  # (| head: as a Unix tool dies of it, without a word)
            return 141
        if args.debug:
            raise
        msg = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        if getattr(args, "scheduler", None) and _scheduler_lost(exc):
            msg = (f"the Dask scheduler at {args.scheduler} was lost during the command ({msg}); "
                   "restart it and run the command again (a fit with --checkpoint-every goes "
                   "on with --resume)")
        print(f"dkernel: error: {msg}", file=sys.stderr)
        return 1
    finally:
        sys.stderr = stderr
        logging.getLogger("dkernel").removeHandler(log_handler)
        logging.getLogger("asyncio").setLevel(asyncio_level)  # (_interrupted raised it)
        warnings.formatwarning = formatwarning
        for log in quieted:
            log.removeFilter(_only_critical)
        for sig, handler in previous.items():
            signal.signal(sig, handler)

