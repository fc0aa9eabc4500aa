"""Argument helpers shared by the commands (one flag name per idea, DESIGN 1)."""

from __future__ import annotations

import argparse


def bandwidth_arg(text: str) -> float | str:
    """A number, or 'auto' (for --bandwidth and --step-size)."""
    if text == "auto":
        return "auto"
    try:
        return float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number or 'auto', got {text!r}") from None


def add_cluster_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--scheduler", metavar="ADDR",
                   help="Dask scheduler address (tcp://host:8786); default: $DASK_SCHEDULER_ADDRESS "
                        "or a new LocalCluster")
    p.add_argument("--workers", type=int, default=None,
                   help="worker processes of the embedded LocalCluster (default: one per core)")
    # Certificates for a tls:// scheduler; without them the Dask configuration's
    # (DASK_DISTRIBUTED__COMM__TLS__*) apply, see deploy/README.md.
    p.add_argument("--tls-ca-file", metavar="PEM", help="CA certificate of a tls:// scheduler")
    p.add_argument("--tls-cert", metavar="PEM", help="client certificate for a tls:// scheduler")
    p.add_argument("--tls-key", metavar="PEM", help="client private key for a tls:// scheduler")


def cluster_options(args: argparse.Namespace) -> dict:
    """Keyword arguments of :func:`dkernel.engine.connect` from the cluster flags."""
    from dkernel.engine.cluster import make_security

    return {"scheduler": args.scheduler, "n_workers": args.workers,
            "security": make_security(args.tls_ca_file, args.tls_cert, args.tls_key)}
