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
