"""Synthetic data generators (docs/design.md §3), NumPy in, zarr stores out."""

from dkernel.datasets.hermite import hermite_eigenfunctions, hermite_eigenvalues, make_hermite
from dkernel.datasets.spheres import (
    make_sphere_polynomial,
    sphere_polynomial_target,
    uniform_sphere,
)
from dkernel.datasets.synthetic import make_blobs_classification, make_dai_ridge, make_store

__all__ = [
    "hermite_eigenfunctions",
    "hermite_eigenvalues",
    "make_hermite",
    "make_blobs_classification",
    "make_dai_ridge",
    "make_store",
    "make_sphere_polynomial",
    "sphere_polynomial_target",
    "uniform_sphere",
]
