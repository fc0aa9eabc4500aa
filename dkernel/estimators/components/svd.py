"""KernelSVD: the SVD of the cross-covariance operator of two views by doubly
stochastic gradients or power steps (Xie et al. 2015, Alg. 3)."""

from __future__ import annotations

from typing import Any

import numpy as np

from dkernel.estimators.components.base import (
    _DOC_POWER_ATTRIBUTES,
    _DOC_TWO_VIEW_ERROR,
    _TwoViewBase,
)
from dkernel.estimators.spec import documented


@documented
class KernelSVD(_TwoViewBase):

    __doc__ = f"""Kernel SVD of the cross-covariance operator E[k(x,.) (x) l(y,.)] by
    doubly stochastic gradients (Xie et al. 2015, Alg. 3), or by power steps
    on the whole pool (two-sided subspace iteration; ``steps``).

    Attributes
    ----------
    x_components_, y_components_ : ndarray (n_features_, n_components)
        Coefficients over each view's pool of the left / right singular
        functions.  As functions on the data they match a dense SVD of the same
        features; the coefficient vectors also carry SGD noise along directions
        the data barely excite, so they are not RKHS-orthonormal (see
        :class:`KernelPCA`'s ``components_``).
    singular_values_ : ndarray (n_components,)
{_DOC_POWER_ATTRIBUTES}{_DOC_TWO_VIEW_ERROR}    history_ : list of dict
        Per epoch: ``epoch``, ``steps``, ``rows``, ``seconds`` and ``covariance``,
        the sum of the singular values of the scores' cross-covariance on the
        epoch's mini-batches (block steps keep [U; V] jointly orthonormal,
        power steps each view: the block steps' figure is about half).
    """
    _method = "ksvd"
    _values_attr = "singular_values_"

    def __init__(self, n_components: int = 4, *, kernel: str = "gaussian",
                 bandwidth: float | str = "auto", kernel_y: str | None = None,
                 bandwidth_y: float | str | None = None, n_features: int = 4096,
                 block_size: int = 256, batch_size: int | str = "auto", n_epochs: int = 5,
                 step_size: float | str = "auto", step_decay: float | str = "auto",
                 center: bool = True, steps: str = "auto", lanes: int | str = "auto",
                 random_state: int = 0, client: Any = None, verbose: bool = False,
                 checkpoint: str | None = None, checkpoint_every: int = 0,
                 resume: bool = False,
                 feature_cache: str = "auto") -> None:
        self._store_params(locals())

    def _metrics(
        self, M: np.ndarray, A: np.ndarray, Bc: np.ndarray
    ) -> tuple[np.ndarray, np.ndarray]:
        # Xie's KSVD is Oja's rule for [[0, C_yx], [C_xy, 0]]: at its fixed point the
        # stacked [U; V] is orthonormal, so each view has U^T U = V^T V = I / 2 (the
        # pool Gram is not used as the metric: see rotate_pca); a power step, and
        # the exact solve, leave each view orthonormal on its own
        k = A.shape[1]
        scale = 0.5 if getattr(self, "steps_", "block") == "block" else 1.0
        return scale * np.eye(k), scale * np.eye(k)
