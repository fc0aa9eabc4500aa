"""KernelPCA, KernelSVD, KernelCCA: doubly stochastic component analysis
(Xie et al. 2015), one module each over a shared base."""

from dkernel.estimators.components.cca import KernelCCA
from dkernel.estimators.components.pca import KernelPCA
from dkernel.estimators.components.svd import KernelSVD

__all__ = ["KernelCCA", "KernelPCA", "KernelSVD"]
