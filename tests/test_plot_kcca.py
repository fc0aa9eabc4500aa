"""KernelCCA's figure shows two sums of correlations that differ, and says
why: the learning curve's is measured on each epoch's batches with the
plain variances of the two views, the spectrum's (``correlations_``) is the
final model's on every row with the ridge alpha in both variances."""

from __future__ import annotations

import numpy as np
import pytest

from dkernel import KernelCCA
from dkernel.datasets import make_dai_ridge


def test_kcca_plot_labels_each_correlation_sum_with_what_it_measures(client):
    pytest.importorskip("matplotlib", reason="dkernel.plot needs the plot extra (matplotlib)")
    from dkernel.plot import learning_curve, spectrum

    X, _ = make_dai_ridge(1500, 4)
    model = KernelCCA(2, bandwidth=1.0, n_features=256, n_epochs=2, client=client)
    model.fit(X[:, :2], X[:, 2:])
    curve = learning_curve(model)
    (label,) = [t.get_text() for t in curve.get_legend().get_texts()]
    assert label == "sum of correlations (on each epoch's batches, without the alpha ridge)"
    assert curve.get_ylabel() == "sum of correlations"
    bars = spectrum(model)
    assert bars.get_title() == (f"KernelCCA: canonical correlation "
                                f"(sum {np.sum(model.correlations_):.3g})\n"
                                f"final model, every row, ridge alpha = {model.alpha:g}")
