"""Exact kernel functions k(X, Z), zonal kernels on spheres and scale heuristics (no Dask here)."""

from dkernel.kernels.bandwidth import median_heuristic, top_eigenvalue
from dkernel.kernels.exact import KERNELS, kernel_diagonal_max, kernel_matrix
from dkernel.kernels.zonal import (
    dim_harmonics,
    dim_polynomials,
    gegenbauer_normalized,
    zonal_kernel,
    zonal_weights,
)

__all__ = [
    "KERNELS",
    "kernel_matrix",
    "kernel_diagonal_max",
    "median_heuristic",
    "top_eigenvalue",
    "dim_harmonics",
    "dim_polynomials",
    "gegenbauer_normalized",
    "zonal_kernel",
    "zonal_weights",
]
