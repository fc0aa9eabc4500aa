"""Worker preload of dkernel's LocalCluster (``cluster.WORKER_PRELOAD``):
the worker process ignores SIGINT, which a terminal's Ctrl-C sends to the
coordinator and its workers alike; the coordinator then stops them itself."""

import signal
import threading

if threading.current_thread() is threading.main_thread():
    signal.signal(signal.SIGINT, signal.SIG_IGN)
