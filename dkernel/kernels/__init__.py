"""Exact kernel functions k(X, Z) and bandwidth heuristics (no Dask here)."""

from dkernel.kernels.exact import KERNELS, kernel_matrix, kernel_diagonal_max
from dkernel.kernels.bandwidth import median_heuristic, top_eigenvalue

__all__ = ["KERNELS", "kernel_matrix", "kernel_diagonal_max", "median_heuristic", "top_eigenvalue"]
from dkernel.kernels.zonal import dim_harmonics, dim_polynomials, gegenbauer_normalized, zonal_kernel, zonal_weights  # noqa: E402,F401
__all__ += ["dim_harmonics", "dim_polynomials", "gegenbauer_normalized", "zonal_kernel", "zonal_weights"]
