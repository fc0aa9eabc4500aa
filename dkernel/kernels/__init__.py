"""Exact kernel functions k(X, Z) and bandwidth heuristics (no Dask here)."""

from dkernel.kernels.exact import KERNELS, kernel_matrix, kernel_diagonal_max
from dkernel.kernels.bandwidth import median_heuristic

__all__ = ["KERNELS", "kernel_matrix", "kernel_diagonal_max", "median_heuristic"]
