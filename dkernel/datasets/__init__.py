"""Synthetic data generators (DESIGN.md section 3), NumPy in, zarr stores out."""

from dkernel.datasets.synthetic import make_blobs_classification, make_dai_ridge, make_store

__all__ = ["make_blobs_classification", "make_dai_ridge", "make_store"]
