"""What the supervised estimators (DSG, EigenPro) share on top of a raw
decision f(X): the target encoding (label codes, the mean of y) and its place
in the model file, and the scikit-learn outputs (predict, decision_function,
score) of a regressor and of a classifier."""

from __future__ import annotations

from typing import Any

import dask.array as da
import numpy as np

from dkernel.data.dataset import Dataset
from dkernel.engine.stall import result
from dkernel.estimators.base import (
    binary_margin,
    discover_classes,
    labels_for_file,
    validate_predict_input,
)
from dkernel.estimators.scoring import (
    accuracy_any,
    regression_score,
    score_targets,
    weighted_score,
)
from dkernel.solvers.targets import TargetEncoding


class Supervised:
    """The encoding of y (``encoding_``) and the validated input of predict;
    the estimator gives ``_decision(X)``, the raw scores of validated X (this
    class comes first in its bases, so it declares no such method)."""

    _task = ""

    def _validated(self, X: Any) -> Any:
        self._check_fitted("coef_")
        return validate_predict_input(self, X)

    def _encoding_arrays(self) -> dict[str, np.ndarray]:
        """The model file's arrays of the encoding (and the user's labels)."""
        e = self.encoding_
        arrays = {"coef": self.coef_, "classes": np.asarray(e.classes),
                  "offset": np.asarray(e.offset, dtype=np.float64)}
        if hasattr(self, "classes_"):
            arrays["labels"] = labels_for_file(self.classes_)
        return arrays

    def _load_encoding(self, arrays: dict, meta: dict) -> TargetEncoding:
        enc = TargetEncoding(meta["encoding"], tuple(arrays["classes"].tolist()),
                             tuple(arrays["offset"].tolist()))
        # a classifier's state relabelled as a regressor's (or the other way) loaded,
        # then failed at predict on shapes ("operands could not be broadcast")
        if (enc.kind == "regression") != (self._task == "regression"):
            raise ValueError(f"its target encoding {enc.kind!r} is not a {self._task} model's "
                             "(a file of another estimator, relabelled?)")
        coef = arrays["coef"]
        if getattr(coef, "ndim", 0) == 2 and coef.shape[1] != enc.n_outputs:
            raise ValueError(f"its coef has {coef.shape[1]} output columns where its target "
                             f"encoding has {enc.n_outputs}")
        if enc.kind != "regression":  # files before label codes have no "labels"
            self.classes_ = arrays.get("labels", arrays["classes"])
        return enc


class RegressorOutputs(Supervised):
    """y's mean is the offset of the decision; predict and R^2."""

    _task = "regression"

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        tags.target_tags.multi_output = True  # 2-D y: one output per column
        return tags

    def _encoding(self, data: Dataset, client: Any) -> TargetEncoding:
        return self._moments(data, client)[0]

    @staticmethod
    def _moments(data: Dataset, client: Any, spread: bool = False
                 ) -> tuple[TargetEncoding, np.ndarray | None]:
        """(the encoding: mean(y) as the offset, and with ``spread`` y's standard
        deviation per column), from one pass over y."""
        # float64 either way: NumPy float32 y gave another offset than the same rows
        # as a dask array (predictions 2e-7 apart; 2e-3 on EigenPro's Nystrom route)
        y = np.asarray(data.host[1], dtype=np.float64) if data.host is not None else \
            data.y.astype(np.float64)
        y = y.reshape(data.n_rows, -1) if spread else y
        stats = [y.mean(axis=0)] + ([y.std(axis=0)] if spread else [])
        if data.host is None:
            stats = [result(client, f, "y's mean") for f in client.compute(stats)]
        offset = tuple(np.atleast_1d(stats[0]).astype(float).tolist())
        return TargetEncoding("regression", offset=offset), (stats[1] if spread else None)

    def _mean(self, X: Any) -> Any:
        """f(X) + mean(y) of validated X, in float64 (f is float32, like the
        feature path: the mean of y = 1e7 + O(1) would lose the O(1) part)."""
        f = self._decision(X).astype(np.float64)
        off = np.asarray(self.encoding_.offset, dtype=np.float64)
        return f + (off[0] if f.ndim == 1 else off)

    def predict(self, X: Any) -> Any:
        """f(X) + mean(y) in float64; lazy dask array for dask input."""
        return self._mean(self._validated(X))

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """R^2 of the prediction (y may be omitted for a store holding ``y``;
        ``sample_weight``, in memory only, weighs the rows as scikit-learn's)."""
        return regression_score(self, X, y, sample_weight)


class ClassifierOutputs(Supervised):
    """Labels discovered on the cluster; decision_function, predict, accuracy."""

    _task = "classification"

    def _encoding_kind(self, classes: np.ndarray) -> str:
        return "onehot"

    def _encoding(self, data: Dataset, client: Any) -> TargetEncoding:
        classes = discover_classes(data, client)
        self.classes_ = classes
        return TargetEncoding(self._encoding_kind(classes), classes=tuple(classes.tolist()))

    def decision_function(self, X: Any) -> Any:
        """Scores, shape (n,) for two classes (positive means ``classes_[1]``), else
        (n, n_classes); lazy for dask input."""
        return binary_margin(self._decision(self._validated(X)))

    def predict(self, X: Any) -> Any:
        """Predicted labels; lazy dask array for dask input."""
        f = self._decision(self._validated(X))
        classes = np.asarray(self.classes_)
        idx = (f > 0).astype(np.int64) if f.ndim == 1 else f.argmax(axis=1)
        if isinstance(idx, da.Array):
            return idx.map_blocks(lambda i: classes[i], dtype=classes.dtype)
        return classes[idx]

    def score(self, X: Any, y: Any = None, sample_weight: Any = None) -> float:
        """Mean accuracy (y may be omitted for a store holding ``y``;
        ``sample_weight``, in memory only, weighs the rows as scikit-learn's)."""
        X, y = score_targets(X, y)
        if sample_weight is not None:
            return weighted_score("accuracy", y, self.predict(X), sample_weight, self.classes_)
        return accuracy_any(y, self.predict(X), self.classes_)
