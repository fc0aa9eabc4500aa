"""Which Dask cluster to run on: the given client, a scheduler address, the
current client, or (the embedded default) a new LocalCluster."""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import dask
from distributed import Client, LocalCluster
from distributed.deploy.spec import SpecCluster

# (re-exported: the engine's callers and tests import them from here)
from dkernel._workers import WORKER_TIMEOUT, worker_timeout, workers_info  # noqa: F401
from dkernel.engine._main_script import check_main_rerunnable

# What a client needs to reach a tls:// scheduler, as CLI flags and as the
# Dask configuration keys (environment variables) distributed.Security reads.
_TLS_SETTINGS = (("tls_ca_file", "--tls-ca-file", "DASK_DISTRIBUTED__COMM__TLS__CA_FILE"),
                 ("tls_client_cert", "--tls-cert", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"),
                 ("tls_client_key", "--tls-key", "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY"))


def make_security(ca_file: str | None = None, cert: str | None = None,
                  key: str | None = None) -> Any:
    """A ``distributed.Security`` from PEM files; None when none is given (the
    Dask configuration, e.g. ``DASK_DISTRIBUTED__COMM__TLS__*``, then applies).

    A key may be omitted when ``cert`` holds the certificate and its key."""
    if ca_file is None and cert is None and key is None:
        return None
    from distributed.security import Security

    for flag, path in (("--tls-ca-file", ca_file), ("--tls-cert", cert), ("--tls-key", key)):
        if path is not None and not os.path.isfile(path):
            raise FileNotFoundError(f"{flag} {path!r} does not exist or is not a file")
    if cert is not None and key is None:
        with open(cert, "rb") as f:
            if b"PRIVATE KEY" not in f.read():  # else OpenSSL's "[SSL] PEM lib" as a connect error
                raise ValueError(f"--tls-cert {cert!r} holds no private key; pass --tls-key "
                                 "(DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY) too, or a PEM file "
                                 "holding both")
    return Security(tls_ca_file=ca_file, tls_client_cert=cert, tls_client_key=key,
                    require_encryption=True)


#: Seconds to reach a scheduler and hear it answer as one.
_CONNECT_TIMEOUT = 20.0


def _check_address(address: str) -> str:
    """``address`` if it reads as protocol://host:port; else a one-line error
    ("invalid literal for int() with base 10" named nothing to change)."""
    from distributed.comm.addressing import parse_address, parse_host_port
    from distributed.comm.registry import get_backend

    try:  # (no scheme is tcp://, as distributed reads it)
        protocol, location = parse_address(address, strict=False)
        if protocol in ("tcp", "tls"):
            parse_host_port(location)
    except (ValueError, TypeError):
        raise ValueError(f"scheduler address {address!r} is not protocol://host:port; pass e.g. "
                         "tcp://host:8786 (tls:// for a TLS scheduler)") from None
    try:
        get_backend(protocol)  # (plug-in transports load here)
    except ValueError:
        raise ValueError(f"scheduler address {address!r}: {protocol}:// is not a protocol Dask "
                         "speaks here; pass e.g. tcp://host:8786") from None
    return address if "://" in address else f"{protocol}://{address}"


class SchedulerUnreachable(ConnectionError):
    """No Dask scheduler answered at the address given (before any work)."""


def _unreachable(address: str, exc: BaseException, origin: str = "omit --scheduler") -> str:
    """``origin``: how to stop asking for ``address`` (where it was given)."""
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
    return (f"cannot reach a Dask scheduler at {address!r} ({reason}); start one with "
            f"'dask scheduler' (see deploy/) or {origin} to use a local cluster")


def _probe_scheduler(address: str, security: Any, timeout: float = _CONNECT_TIMEOUT,
                     origin: str = "omit --scheduler") -> None:
    """Connect to ``address`` and ask for its identity, all within ``timeout``:
    a port that accepts and never answers held ``Client()`` for ever (its
    timeout does not cover the handshake), and one that answers HTTP made it
    read the reply as a 3 EiB frame.  Raises ConnectionError, naming what to change."""
    import asyncio
    import ssl

    from distributed.comm import connect

    async def probe() -> Any:
        args = security.get_connection_args("client") if security is not None else {}
        comm = await connect(address, timeout=timeout, **args)
        try:
            box["phase"] = "answer"  # connected: what comes back is the peer's
            await comm.write({"op": "identity", "reply": True})
            return await comm.read()
        finally:
            comm.abort()

    async def bounded() -> Any:
        return await asyncio.wait_for(probe(), timeout)

    box: dict = {}

    def run() -> None:  # its own loop: the caller may be inside one (a notebook)
        try:
            box["reply"] = asyncio.run(bounded())
        except BaseException as exc:
            box["error"] = exc
    thread = threading.Thread(target=run, name="dkernel-scheduler-probe", daemon=True)
    thread.start()
    thread.join(timeout + 5)
    exc = box.get("error")
    if thread.is_alive() or isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        raise SchedulerUnreachable(
            f"{address} did not answer as a Dask scheduler within {timeout:.0f} s; check the "
            "address (a scheduler listens on 8786 by default, its dashboard on 8787) and that "
            "no firewall holds the connection")
    causes, cause = [], exc
    while cause is not None and len(causes) < 8:  # (distributed wraps the SSL error)
        causes.append(cause)
        cause = cause.__cause__ or cause.__context__
    if any(isinstance(c, ssl.SSLError) or "SSL" in type(c).__name__
           or "TLSV1_ALERT" in str(c) or "CERTIFICATE" in str(c) for c in causes):
        raise SchedulerUnreachable(
            f"the TLS handshake with {address} failed ({exc}); check --tls-cert, --tls-key and "
            "--tls-ca-file (DASK_DISTRIBUTED__COMM__TLS__*): the certificate must match its key "
            "and be signed by the CA the scheduler trusts")
    if isinstance(exc, OSError) and box.get("phase") != "answer":
        # (a timeout or a refusal: not the closed stream a TLS scheduler gives plain tcp)
        hint = ("; a scheduler serving TLS needs a tls:// address"
                if address.startswith("tcp://") and "Timed out" not in str(exc) else "")
        raise SchedulerUnreachable(_unreachable(address, exc, origin) + hint)
    if exc is not None and not isinstance(exc, (MemoryError, ValueError, EOFError)):
        # the transport itself failed (ucx:// without its library), before any answer
        raise SchedulerUnreachable(f"cannot connect to {address} ({type(exc).__name__}: {exc})")
    # (else something answered: an HTTP reply read as a frame asked for 3 EiB)
    reply = box.get("reply")
    if exc is not None or not isinstance(reply, dict) or \
            "Scheduler" not in str(reply.get("type", "")):  # (subclasses too)
        raise SchedulerUnreachable(
            f"{address} answered, but not as a Dask scheduler; check the port (a scheduler "
            "listens on 8786 by default; 8787 is its dashboard)")


def _check_tls(address: str, security: Any) -> Any:
    """The security to connect to ``address`` with; a one-line error naming the
    missing TLS settings instead of Dask's "TLS expects a `ssl_context` argument"."""
    if not address.startswith("tls://"):
        if security is not None and getattr(security, "require_encryption", False) \
                and address.startswith("tcp://"):
            # else Dask's "encryption required by Dask configuration", naming nothing to change
            raise ConnectionError(f"TLS certificates are given but the scheduler address {address} "
                                  f"is plain tcp://; use {'tls://' + address[6:]} if the "
                                  "scheduler runs TLS, or drop the --tls-* settings")
        return security
    if security is None:
        from distributed.security import Security

        security = Security()  # reads the Dask configuration / environment
    # The certificate may carry its key (one PEM file), so the key is optional.
    missing = [(flag, env) for attr, flag, env in _TLS_SETTINGS[:2]
               if not getattr(security, attr, None)]
    if missing:
        flags = "/".join(flag for _, flag, _ in _TLS_SETTINGS)
        envs = ", ".join(e for _, _, e in _TLS_SETTINGS)
        what = " and ".join(f"{flag} ({env})" for flag, env in missing)
        raise ConnectionError(
            f"the scheduler at {address} needs TLS, and this client has no {what}: pass "
            f"{flags} or set {envs} (see deploy/README.md, TLS)")
    return security


def _nothing() -> None:
    return None


def configured_scheduler() -> str | None:
    """The scheduler address the user configured for Dask: ``$DASK_SCHEDULER_ADDRESS``
    or ``scheduler-address`` in their Dask configuration (a YAML file in
    ~/.config/dask), as ``distributed.Client()`` reads it.  The YAML key was
    ignored: the fit ran on a LocalCluster of the login node, without a word."""
    return os.environ.get("DASK_SCHEDULER_ADDRESS") or dask.config.get("scheduler-address",
                                                                       None)


def _origin(address: str | None) -> str:
    """How to stop asking for ``address``, by where it was given (the CLI passes the
    configuration's as its scheduler)."""
    if address and address == os.environ.get("DASK_SCHEDULER_ADDRESS"):
        return "unset DASK_SCHEDULER_ADDRESS"
    if address and address == dask.config.get("scheduler-address", None):
        return "remove scheduler-address from the Dask configuration"
    return "omit --scheduler"


def require_workers(client: Client, timeout: float | None = None) -> None:
    """Return once the cluster has a worker; wait (saying so) up to ``timeout``
    seconds (default :func:`worker_timeout`; 0: not at all) when it has none,
    then stop with a one-line error.  A pending task is left with the scheduler
    while waiting, so an adaptive cluster scaled to zero scales up for it."""
    if client.nthreads():
        return
    if timeout is None:
        timeout = worker_timeout()
    address = getattr(client.scheduler, "address", None) or "the scheduler"
    refusal = (f"the Dask scheduler at {address} has had no workers for {timeout:g} s; start "
               f"workers ('dask worker {address}'), or set DKERNEL_WORKER_TIMEOUT to wait "
               "longer")
    if timeout <= 0:  # distributed reads a timeout of 0 as none: it would wait for ever
        raise RuntimeError(refusal)
    _log.warning("the Dask scheduler at %s has no workers; waiting up to %g s for one "
                 "(start workers with 'dask worker %s')", address, timeout, address)
    probe = client.submit(_nothing, pure=False,
                          key=f"dkernel-wait-for-workers-{uuid.uuid4().hex[:8]}")
    try:
        client.wait_for_workers(1, timeout=timeout)
    except TimeoutError:
        raise RuntimeError(refusal) from None
    finally:
        probe.cancel()


_log = logging.getLogger("dkernel.engine")


@contextmanager
def connect(client: Client | None = None, scheduler: str | None = None,
            n_workers: int | None = None, security: Any = None,
            upload_package: bool = False) -> Iterator[Client]:
    """Yield a client; anything created here is closed on exit.

    Called inside a Dask task (a fit submitted as a task: a sweep, a workflow
    runner) the task's thread leaves its worker's pool while the fit runs, as
    ``distributed.worker_client`` does: the fit's tasks pinned to that worker
    waited for the thread the caller held, for ever.

    Order: ``client`` if given; else ``scheduler`` (or ``$DASK_SCHEDULER_ADDRESS``);
    else the current default client; else ``scheduler-address`` of the Dask
    configuration (a YAML file, as ``Client()`` reads it); else a LocalCluster with one
    single-threaded worker process per core.  ``security`` (a
    ``distributed.Security``, see :func:`make_security`) is used for a
    ``tls://`` scheduler; without it the Dask configuration's TLS settings are.
    A cluster without workers is waited for (:func:`require_workers`).

    The workers of a cluster dkernel did not start must run this dkernel
    (:func:`dkernel.engine.versions.check_workers`, which refuses one that
    does not); ``upload_package=True`` first sends this client's dkernel to
    workers whose dkernel differs.
    """
    with _seceded(), _connect(client, scheduler, n_workers, security, upload_package) as c:
        yield c


@contextmanager
def _seceded() -> Iterator[None]:
    """Out of the worker's thread pool for the block when called in a task's thread."""
    from distributed.worker import thread_state

    if getattr(thread_state, "key", None) is None:
        yield
        return
    from distributed import worker_client

    with worker_client():
        yield


@contextmanager
def _connect(client: Client | None, scheduler: str | None, n_workers: int | None,
             security: Any, upload_package: bool) -> Iterator[Client]:
    from dkernel.engine.versions import check_workers

    if client is not None:
        if getattr(client, "status", "running") in ("closing", "closed"):
            raise ValueError(f"client={client!r} is closed; pass a running Client (or none, "
                             "for a local cluster)")
        if getattr(client, "asynchronous", False):  # ("'coroutine' object is not iterable")
            raise ValueError(f"client={client!r} is an asynchronous Client, and a fit blocks: "
                             "pass a synchronous Client (or run the fit in a thread, with "
                             "its own Client)")
        require_workers(client)
        check_workers(client, upload=upload_package)
        # as the default inside: distributed.wait() asks for the default client, which
        # a client given to an estimator need not be (GridSearchCV over an EigenPro
        # kernel fit with a client that is not the default: "No clients found")
        with client.as_current():
            yield client
        return
    address = scheduler or os.environ.get("DASK_SCHEDULER_ADDRESS")
    origin = _origin(address)
    if not address:
        try:
            from distributed import get_client

            current = get_client()
        except ValueError:
            current = None
        if current is not None:  # (before the configuration's address, as Client() does)
            require_workers(current)
            check_workers(current, upload=upload_package)
            yield current
            return
        address = dask.config.get("scheduler-address", None)
        origin = _origin(address)
    if address:
        address = _check_address(address)
        security = _check_tls(address, security)
        _probe_scheduler(address, security, origin=origin)  # Client() can wait for ever
        try:
            c = Client(address, timeout=f"{_CONNECT_TIMEOUT}s", security=security)
        except OSError as exc:
            raise SchedulerUnreachable(_unreachable(address, exc, origin)) from None
        try:
            require_workers(c)
            check_workers(c, upload=upload_package)
            yield c
        finally:
            c.close()
        return
    # Worker-side failures (bad input found on a worker) reach the caller as
    # exceptions; the workers' own log lines would only repeat them.  Its
    # workers run this interpreter's dkernel: nothing to check or upload.
    saved = environ_before()
    with _STARTING:  # (two threads' clusters at once: "distributed.dashboard has no
        # attribute 'scheduler'", a GridSearchCV fold lost on the threading backend)
        if _in_worker_process():
            # a joblib/loky worker (cross_val_score(n_jobs=2)) cannot start worker
            # processes ("Nanny failed to start"): threads in this process instead
            _log.warning("dkernel: no client given inside a worker process (n_jobs > 1?); "
                         "fitting on a cluster of threads in it")
            cluster = LocalCluster(n_workers=1, threads_per_worker=n_workers or 1,
                                   processes=False, dashboard_address=None,
                                   silence_logs=logging.CRITICAL)
        else:
            cluster = local_cluster(n_workers=n_workers or _cores(),
                                    silence_logs=logging.CRITICAL)
        try:
            # not the process's default: another thread's fit would take it as its
            # own (get_client above) and lose it when this fit closes it
            c = Client(cluster, set_as_default=False)
        except BaseException:  # (Ctrl-C as the client connects: the cluster is ours)
            cluster.close()
            raise
    try:
        # spawn also for the workers a nanny restarts while the cluster lives
        with dask.config.set({_START_METHOD: "spawn"}), c.as_current():
            yield c
    finally:
        try:
            c.close()
        finally:  # (a signal during the client's close still stops the workers)
            try:
                cluster.close()
            finally:  # (a worker restarted meanwhile: its nanny wrote them again)
                put_back_environ(saved)
                _release_scheduler()


def _release_scheduler() -> None:
    """Let the closed cluster's in-process Scheduler be freed.  distributed
    (2026.8) memoises ``core._expects_comm`` on the bound handler methods it
    is asked about, unbounded, so every Scheduler a fit started stayed alive
    with its logging handler (gc.collect() after 8 fits with no client: 8
    Schedulers and 8 handlers on the "distributed.scheduler" logger; cleared,
    0).  The cache only saves an ``inspect.signature`` per handler."""
    import distributed.core

    clear = getattr(getattr(distributed.core, "_expects_comm", None), "cache_clear", None)
    if clear is not None:
        clear()


#: glibc settings for worker processes (set before the process starts: the
#: nanny's ``pre-spawn-environ``).  Dask's default MALLOC_TRIM_THRESHOLD_ of
#: 64 KiB, like any explicit malloc setting, also freezes glibc's mmap
#: threshold at 128 KiB, so every chunk-sized buffer (a decoded zarr chunk, a
#: tile of features) is a fresh mmap whose pages fault in on first touch
#: (docs/design.md §4).  Reading one 8 MB zstd chunk of the 2M x 32 store took 25 ms in
#: a process with Dask's setting and 6 ms with these (a plain loop over 20
#: chunks); buffers up to 32 MiB are then reused from the heap, and at most
#: 64 MiB of freed heap is kept per worker.
WORKER_MALLOC = {"MALLOC_TRIM_THRESHOLD_": 64 << 20, "MALLOC_MMAP_THRESHOLD_": 32 << 20}


#: The Dask setting of how worker processes start.  dkernel's own LocalCluster
#: always uses spawn, whatever the configuration says.  Under fork, two workers
#: were found alive 5 minutes after a SIGKILL of their coordinator (once in
#: three fits, issue 32; not seen again in 5 tries here): a forked worker
#: inherits the ends of its siblings' pipes through which each watches for the
#: coordinator's death (distributed.process.AsyncProcess), a way for workers to
#: hold each other alive.  A forked worker is also a copy of the coordinator,
#: threads' locks included, and a kernel-form EigenPro fit through the CLI
#: took 223 s under fork against 113 s under spawn.
_START_METHOD = "distributed.worker.multiprocessing-method"

#: Imported by every worker process of dkernel's LocalCluster: Ctrl-C in a
#: terminal reaches the whole process group, workers included; the
#: coordinator alone handles it (one line, then it closes the cluster), so the
#: workers ignore it instead of each printing a KeyboardInterrupt traceback.
WORKER_PRELOAD = "dkernel.engine._ignore_sigint"


#: One LocalCluster starts at a time in this process (:func:`connect`).
_STARTING = threading.Lock()


def _in_worker_process() -> bool:
    """A daemonic or loky worker process, which cannot start processes of its own."""
    import multiprocessing

    return (multiprocessing.current_process().daemon
            or multiprocessing.get_start_method(allow_none=True) == "loky")


def _cores() -> int:
    """The cores this process may use: its CPU set and its cgroup's CPU quota
    (Dask's count).  ``os.cpu_count()`` is the host's: under ``taskset`` or in
    a container with a CPU quota it started more workers than cores."""
    from dask.system import cpu_count

    return max(1, cpu_count())


def local_cluster(n_workers: int | None = None, **kwargs: Any) -> LocalCluster:
    """A LocalCluster as dkernel starts one: single-threaded worker processes
    (one per core by default) with :data:`WORKER_MALLOC`, started by spawn
    (:data:`_START_METHOD`) and deaf to Ctrl-C (:data:`WORKER_PRELOAD`);
    ``kwargs`` go to ``LocalCluster`` (``memory_limit``, ``dashboard_address``, ...).

    Workers started otherwise get the same malloc settings from the environment of
    ``dask worker`` (``deploy/local-cluster.sh`` and the image in
    ``deploy/Dockerfile`` set them)."""
    options = {"threads_per_worker": 1, "processes": True, "dashboard_address": ":0", **kwargs}
    if options["processes"]:
        check_main_rerunnable()
    preload = options.get("preload") or dask.config.get("distributed.worker.preload") or ()
    options["preload"] = [*preload, WORKER_PRELOAD]
    environ = _spawn_environ()
    # A nanny takes these once, when it is created (restarts reuse them), and a
    # value in this process's environment wins over the configuration: ours are
    # put in the environment while the nannies are created, and what the
    # nannies wrote there taken back after (:func:`put_back_environ`)
    saved = environ_before()
    os.environ.update({k: str(v) for k, v in WORKER_MALLOC.items()})
    made: list = []
    try:
        with dask.config.set({"distributed.nanny.pre-spawn-environ": environ,
                              _START_METHOD: "spawn"}):
            return _Cluster(n_workers=n_workers or _cores(), made=made, **options)
    except BaseException:
        # Ctrl-C in the start's first second left its workers running for the
        # rest of the session (LocalCluster cleans up after errors only): close
        # the cluster this call made, which the caller never got
        for cluster in made:
            _close_started(cluster)
        raise
    finally:
        put_back_environ(saved)


class _Cluster(LocalCluster):
    """A LocalCluster that hands itself to ``made`` before it starts: an
    interrupted start leaves its caller nothing else to close."""

    def __init__(self, *args: Any, made: list, **kwargs: Any) -> None:
        made.append(self)
        super().__init__(*args, **kwargs)


def _spawn_environ() -> dict[str, Any]:
    """The environment dkernel's nannies give their workers: the configured
    ``pre-spawn-environ`` (OMP_NUM_THREADS=1, ...) with :data:`WORKER_MALLOC`."""
    return {**dask.config.get("distributed.nanny.pre-spawn-environ", {}), **WORKER_MALLOC}


def _nanny_writes() -> dict[str, str]:
    """What a nanny writes into this process's environment before it spawns a
    worker: :func:`_spawn_environ`, and PYTHONHASHSEED where none is set."""
    return {**{k: str(v) for k, v in _spawn_environ().items() if v is not None},
            "PYTHONHASHSEED": "6640"}


def environ_before() -> dict[str, str | None]:
    """The values :func:`put_back_environ` restores."""
    return {k: os.environ.get(k) for k in _nanny_writes()}


def put_back_environ(saved: dict[str, str | None]) -> None:
    """Take back what nannies wrote into this process's environment (every
    later subprocess of the caller ran single-threaded BLAS under their
    OMP_NUM_THREADS=1): a key that holds a nanny's value and held another
    before gets its value back; a value set meanwhile by anyone else stays."""
    for k, value in _nanny_writes().items():
        if os.environ.get(k) == value and saved.get(k) != value:
            if saved.get(k) is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = saved[k]  # type: ignore[assignment]


def _close_started(cluster: SpecCluster, wait: float = 30.0) -> None:
    """Close a cluster whose start was interrupted.  Its start goes on in its
    event loop, and a close while a worker is still starting fails
    ("AssertionError: Status.init", distributed's ``SpecCluster._close``) and
    leaves the workers running: wait (seconds) for its workers to settle."""
    from distributed.core import Status

    settled = {Status.running, Status.failed, Status.closing, Status.closed}
    deadline = time.monotonic() + wait
    while time.monotonic() < deadline and hasattr(cluster, "status") and (
            cluster.status not in settled
            or any(w.status not in settled for w in getattr(cluster, "_created", ()))):
        time.sleep(0.1)
    with contextlib.suppress(Exception):
        cluster.close(timeout=10)
