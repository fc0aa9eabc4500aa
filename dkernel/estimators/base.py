"""What every dkernel estimator shares: the scikit-learn contract (parameters,
tags, input validation, clone with a live client), engine options, bandwidth
resolution, label discovery and lazy prediction."""

from __future__ import annotations

import copy
import inspect
import math
import os
import warnings
from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import dask
import dask.array as da
import numpy as np
import scipy.sparse
import sklearn.base
from dask.base import tokenize
from sklearn.exceptions import NotFittedError  # what every estimator raises before fit
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array, column_or_1d, validate_data

from dkernel._stack import user_stacklevel
from dkernel.data.dataset import Dataset, open_dataset
from dkernel.data.validate import check_finite_chunk
from dkernel.engine import EngineOptions
from dkernel.engine.stall import result, scatter
from dkernel.estimators.model_file import register, write_model
from dkernel.estimators.params import AUTO, check_values
from dkernel.estimators.spec import check_random_state_param, params_of

#: Largest seed a resolved ``random_state`` takes (what NumPy's legacy seeding accepts).
_MAX_SEED = 2**31 - 1


class BaseEstimator(sklearn.base.BaseEstimator):
    """scikit-learn contract: ``__init__`` stores parameters verbatim, learned
    state ends in ``_``, ``fit`` returns self; get_params/set_params/clone work,
    and tags come from scikit-learn's mixins (the subclasses add the
    classifier / regressor / transformer one).

    ``client`` is a live connection, not a hyper-parameter value: ``clone``
    hands the same Client to the copy instead of deep-copying it (as dask-ml
    does), so ``GridSearchCV`` and ``cross_val_score`` work with ``client=``.
    """

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        register(cls)  # model files name the class; dkernel.io.load_model finds it here

    @classmethod
    def _param_names(cls) -> list[str]:
        sig = inspect.signature(cls.__init__)
        return [p for p in sig.parameters if p != "self"]

    def __sklearn_clone__(self) -> BaseEstimator:
        client = getattr(self, "client", None)
        if client is None:
            return super().__sklearn_clone__()
        # clone a shallow copy without the client (sklearn deep-copies every
        # parameter, and a Client holds sockets and asyncio tasks), then share it
        bare = copy.copy(self)
        bare.client = None
        new = sklearn.base.clone(bare)
        new.client = client
        return new

    def __copy__(self) -> BaseEstimator:
        # a shallow copy shares the client (clone relies on it); pickling does not
        new = object.__new__(type(self))
        new.__dict__.update(self.__dict__)
        return new

    def __deepcopy__(self, memo: dict) -> BaseEstimator:
        # everything copied but the client, which is shared (a Client holds
        # sockets and asyncio tasks: deepcopy of a Pipeline holding one failed)
        new = object.__new__(type(self))
        memo[id(self)] = new
        new.__dict__.update({k: v if k == "client" else copy.deepcopy(v, memo)
                             for k, v in self.__dict__.items()})
        return new

    def __getstate__(self) -> dict:
        # A Client (sockets, an event loop) cannot travel to another process; the
        # usual way one gets asked to is n_jobs > 1 in scikit-learn's model
        # selection, where distributed's PicklingError named neither cause nor fix.
        # A fitted model needs no client to predict in memory, so it travels
        # without it (joblib.dump, permutation_importance(n_jobs=2)); an
        # unfitted one would fit on some other cluster there, so it is refused.
        if getattr(self, "client", None) is not None and self._fitted():
            return {**super().__getstate__(), "client": None}
        if getattr(self, "client", None) is not None:
            raise TypeError(
                f"{type(self).__name__}(client=...) cannot be pickled: its Client is a live "
                "connection.  Run cross-validation / GridSearchCV with n_jobs=1 (the Dask "
                "cluster already runs each fit in parallel), and save models with .save()")
        return super().__getstate__()

    def _fitted(self) -> bool:
        """Has fitted attributes (scikit-learn's test: a name ending in _)."""
        return any(k.endswith("_") and not k.startswith("__") for k in vars(self))

    def __sklearn_tags__(self) -> Any:
        tags = super().__sklearn_tags__()
        # dense rows only: random features of sparse rows are dense anyway (see
        # check_not_sparse for what to do with sparse data)
        tags.input_tags.sparse = False
        tags.input_tags.allow_nan = False
        return tags

    def set_params(self, **params: Any) -> BaseEstimator:
        valid = self._param_names()
        for k, v in params.items():
            if k not in valid:
                raise ValueError(f"{type(self).__name__} has no parameter {k!r}; valid: "
                                 f"{', '.join(valid)}")
            setattr(self, k, v)
        return self

    def __repr__(self) -> str:
        defaults = {k: p.default
                    for k, p in inspect.signature(type(self).__init__).parameters.items()}
        changed = [f"{k}={v!r}" for k, v in self.get_params().items()
                   if k in defaults and not _same(v, defaults[k])]
        return f"{type(self).__name__}({', '.join(changed)})"

    def _store_params(self, values: dict[str, Any]) -> None:
        """What every ``__init__`` does: store each parameter verbatim (the
        scikit-learn contract; the checks run at fit)."""
        for name in self._param_names():
            if name in values:
                setattr(self, name, values[name])

    def _check_params(self) -> None:
        """Each parameter against its declaration (:mod:`dkernel.estimators.spec`),
        then the rules between parameters; the estimators add their own."""
        # (validation_fraction / n_iter_no_change without early_stopping are left
        # alone, as scikit-learn's SGD does: a grid over early_stopping sets them for
        # every candidate; the CLI refuses them)
        check_values(params_of(type(self)), self.get_params(deep=False))
        seed = getattr(self, "random_state", 0)  # (SphereRegressor has none: "no attribute")
        if getattr(self, "resume", False) and not isinstance(seed, (int, np.integer)):
            raise ValueError(
                f"resume=True needs an integer random_state (the checkpoint's seed), got "
                f"{self.random_state!r}; pass the random_state_ of the interrupted fit "
                f"(dkernel info {getattr(self, 'checkpoint', None) or 'CHECKPOINT'} prints it)")
        checkpoint = getattr(self, "checkpoint", None)
        if checkpoint is None and getattr(self, "resume", False):
            raise ValueError("resume=True needs checkpoint, the file to continue from")
        if checkpoint is None and getattr(self, "checkpoint_every", 0):
            raise ValueError(f"checkpoint_every={self.checkpoint_every} needs checkpoint, the "
                             "file to write")
        if checkpoint is not None and not (self.checkpoint_every or self.resume):
            raise ValueError(
                f"checkpoint={checkpoint!r} is written every checkpoint_every steps, and "
                "checkpoint_every=0 writes none; set checkpoint_every (or resume=True)")

    def _given(self, name: str) -> Any:
        """A setting's value, None where it is left automatic ("auto", or None
        as EigenPro's settings were written before "auto")."""
        value = getattr(self, name)
        return None if value is None or (isinstance(value, str) and value == AUTO) else value

    def _given_batch(self, n_rows: int) -> int | None:
        """The ``batch_size`` given, clipped to the ``n_rows`` rows a step can
        take (with a warning, as scikit-learn's MLP); None where automatic.  A
        batch of 100000 on 2000 rows took steps of 2000 while the step size and
        preconditioner were sized for 100000: training R^2 0.07 against 0.98."""
        given = self._given("batch_size")
        if given is None or int(given) <= int(n_rows):
            return None if given is None else int(given)
        warnings.warn(f"batch_size={given} is larger than the {n_rows} rows a step can take; "
                      f"using {n_rows} (one step an epoch)", UserWarning,
                      stacklevel=user_stacklevel())
        return int(n_rows)

    def _keep_pool(self, features: Any, n_features: int) -> None:
        """The fitted feature map and what it fixes (``bandwidth_``, the input
        and pool widths)."""
        self.features_ = features
        self.bandwidth_ = features.bandwidth
        self.n_features_in_ = features.n_inputs
        self.n_features_ = int(n_features)

    def _check_fitted(self, attr: str) -> None:
        if not hasattr(self, attr):
            raise NotFittedError(f"this {type(self).__name__} is not fitted yet; call fit first")

    def _engine_options(self) -> EngineOptions:
        return EngineOptions(
            lanes=getattr(self, "lanes", 4), checkpoint=getattr(self, "checkpoint", None),
            checkpoint_every=getattr(self, "checkpoint_every", 0),
            resume=getattr(self, "resume", False), progress=bool(getattr(self, "verbose", False)))

    def save(self, path: str) -> None:
        """Save the fitted model (``.npz`` + JSON metadata, no pickle)."""
        write_model(self, path)


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except Exception:
        return a is b


def resolve_random_state(random_state: Any) -> int:
    """The integer seed a fit uses (stored as ``random_state_``).

    An int is used as given, so ``random_state=0`` fits the same model as
    ever.  A RandomState or Generator gives one draw (advancing it, as in
    scikit-learn); None draws from NumPy's global RandomState, so
    ``np.random.seed`` makes it repeatable.  Workers only ever see the int.
    """
    check_random_state_param(random_state)
    if isinstance(random_state, (int, np.integer)):
        return int(random_state)
    if isinstance(random_state, np.random.Generator):
        return int(random_state.integers(0, _MAX_SEED))
    return int(check_random_state(random_state).randint(0, _MAX_SEED))


def discover_classes(data: Dataset, client: Any) -> np.ndarray:
    """Sorted label set of y (y is small next to X, so this is one cheap pass)."""
    if data.y is None:
        raise ValueError("classification needs targets y")
    if data.y.ndim == 2 and data.y.shape[1] != 1:
        raise ValueError("classification targets must be one label per row, got y of shape "
                         f"{data.y.shape}")
    if data.host is not None:
        classes = np.unique(data.host[1])
    else:
        classes = result(client, client.compute(_labels(data.y)), "y's classes")
    if classes.dtype.kind == "f" and not np.isfinite(classes).all():
        raise ValueError(f"y holds {float(classes[~np.isfinite(classes)][0])} labels (missing "
                         "values); drop or label those rows before fitting")
    if classes.dtype.kind == "f" and not np.all(np.mod(classes, 1) == 0):
        bad = classes[np.mod(classes, 1) != 0][0]
        raise ValueError(
            f"classification labels must be whole numbers, found {bad!r} among "
            f"{f'more than {_MAX_CLASSES}' if classes.size > _MAX_CLASSES else classes.size} "
            "distinct values; use a regressor (--task regression) for continuous targets"
        )
    if len(classes) > _MAX_CLASSES:
        raise ValueError(
            f"y has more than {_MAX_CLASSES} distinct values: a classifier fits one output per "
            "class, so this looks like a continuous or ID-like target; use a regressor "
            "(--task regression), or fit on the labels")
    check_two_classes(classes)
    return classes


#: Most distinct labels a classifier is fitted on (out-of-core y): each chunk
#: and each merge keeps at most one more, so a continuous or ID-like target is
#: refused without its distinct values on one worker and the client (da.unique
#: held all of them: 7.3M values of 8M rows).
_MAX_CLASSES = 100_000


def _labels(y: da.Array) -> Any:
    """The delayed sorted labels of y, capped (:data:`_MAX_CLASSES`), merged as a tree."""
    parts = [dask.delayed(_capped_unique)(b) for b in y.reshape(-1).to_delayed().ravel()]
    while len(parts) > 1:
        parts = [dask.delayed(_capped_unique)(*parts[i:i + 8]) for i in range(0, len(parts), 8)]
    return parts[0]


def _capped_unique(*blocks: Any) -> np.ndarray:
    """Sorted distinct values of ``blocks``: at most ``_MAX_CLASSES + 1`` of them,
    keeping one that is not a whole number and one that is not finite (what the
    checks after it name)."""
    u = np.unique(np.concatenate([np.asarray(b).reshape(-1) for b in blocks]))
    if len(u) <= _MAX_CLASSES + 1:
        return u
    keep = [u[: _MAX_CLASSES + 1]]
    if u.dtype.kind == "f":
        finite = np.isfinite(u)
        keep += [u[~finite][:1], u[finite][np.mod(u[finite], 1) != 0][:1]]
    return np.unique(np.concatenate(keep))


def check_two_classes(classes: np.ndarray) -> None:
    if classes.size < 2:
        raise ValueError(
            f"y has a single class ({classes[0]!r}); classification needs at least two classes, "
            "one class leaves nothing to separate"
        )


# scikit-learn's input contract ------------------------------------------------------
def is_in_memory(X: Any) -> bool:
    """True for input this process holds (NumPy, pandas, lists, scipy sparse); False for
    store paths, dask and zarr arrays, which stay lazy and are checked by open_dataset."""
    if X is None or isinstance(X, (str, os.PathLike, da.Array)):
        return False
    return not type(X).__module__.startswith(("zarr", "dask"))


def check_not_sparse(X: Any, name: str) -> None:
    if scipy.sparse.issparse(X):
        raise TypeError(
            f"{name} is a scipy sparse {type(X).__name__} of shape {X.shape}; dkernel needs dense "
            f"rows (random features of sparse rows are dense). Pass {name}.toarray() if it fits in "
            "memory, or write it to a dense zarr store by row chunks ('dkernel ingest' reads "
            "libsvm files) and fit on the store path"
        )


#: dtype rule for in-memory X: float32 and float64 are kept, anything else becomes
#: float32 (the feature path computes in float32; docs/design.md §4).
_FLOAT_DTYPES = [np.float32, np.float64]


def _listed_as_numpy(X: Any) -> Any:
    """A list or tuple as NumPy makes it (floats: float64), so that it keeps
    the dtype the same rows in an array keep: scikit-learn gave lists the
    first dtype allowed, float32, and another model (bandwidth 2.68251522707
    against 2.68251521198, predictions 7.2e-5 apart)."""
    return np.asarray(X) if isinstance(X, (list, tuple)) else X


def validate_fit_input(est: Any, X: Any, y: Any = None, *, target: str,
                       dtype: list | None = None) -> tuple[Any, Any, np.ndarray | None]:
    """Validate fit's input at the boundary, once; return ``(X, y, labels)``.

    In-memory input (NumPy, pandas, lists) goes through scikit-learn's
    ``validate_data``, which sets ``n_features_in_`` and ``feature_names_in_``
    (from DataFrame columns).  ``target`` says what y is: "classification"
    (labels of any kind: kept in ``labels``, returned as integer codes
    0..c-1 so the workers only ever see integers), "regression" (float),
    "view" (the second view of KernelSVD / KernelCCA, 1-D or 2-D) or "none"
    (ignored).  Store paths and dask arrays pass through unchanged: they are
    checked lazily by :func:`~dkernel.data.open_dataset`.  NaN / infinity
    in in-memory X and y is left to open_dataset, whose message names the row.
    """
    check_not_sparse(X, "X")
    check_not_sparse(y, "Y" if target == "view" else "y")
    if target == "none":
        y = None
    if y is None and target != "none" and is_in_memory(X):
        what = "the second view Y" if target == "view" else "targets y"
        raise ValueError(f"{type(est).__name__} requires y to be passed, but the target y is None; "
                         f"pass {what}, or fit on a store path whose array 'y' holds them")
    if not is_in_memory(X):
        for attr in ("feature_names_in_", "n_features_in_"):  # from an earlier in-memory fit
            if attr in vars(est):
                delattr(est, attr)
        if y is not None and is_in_memory(y) and target == "classification" and \
                not _numeric(y):
            # text labels in memory beside a lazy X are encoded here as beside a NumPy X
            # (they were refused with advice to pass y in memory, which it was); numeric
            # ones pass as before, to be discovered on the cluster
            labels, codes = _encode_labels(y)
            return X, codes, labels
        if y is not None and is_in_memory(y) and target == "regression" and \
                np.asarray(y).dtype.kind in "USO":  # (it was told "a classifier takes labels")
            raise TypeError(f"y holds {np.asarray(y).dtype} values; a regressor needs numeric "
                            "targets (labels that are not numbers need a classifier)")
        return X, y, None
    X = validate_data(est, _listed_as_numpy(X), reset=True, accept_sparse=False,
                      dtype=dtype or _FLOAT_DTYPES,
                      ensure_all_finite=False, ensure_min_samples=2)
    labels = None
    if y is not None and is_in_memory(y):
        if target == "classification":
            labels, y = _encode_labels(y)
        else:
            y = check_array(y, ensure_2d=False, dtype=_FLOAT_DTYPES if target == "view" else
                            [np.float64, np.float32], ensure_all_finite=False, ensure_min_samples=0,
                            input_name="Y" if target == "view" else "y")
    return X, y, labels


def _encode_labels(y: Any) -> tuple[np.ndarray, np.ndarray]:
    """(sorted labels, int32 codes 0..c-1) of in-memory classification targets."""
    if getattr(getattr(y, "dtype", None), "name", "") == "category":  # pandas: its values
        y = np.asarray(y)
    y = column_or_1d(y, warn=True)
    try:
        check_classification_targets(y)
    except ValueError as exc:
        if "Unknown label type" not in str(exc):
            raise
        raise ValueError(f"{exc}; classification needs discrete labels (use a regressor "
                         "for continuous targets)") from None
    labels, codes = np.unique(y, return_inverse=True)
    check_two_classes(labels)
    return labels, codes.astype(np.int32).reshape(-1)


def _numeric(y: Any) -> bool:
    """Whether in-memory labels are numbers (a categorical Series: its values')."""
    return np.asarray(y).dtype.kind in "biuf"


def warn_many_classes(classes: np.ndarray, n_rows: int) -> None:
    """Warn when numeric labels look like a quantity: whole-number targets
    (counts, years) were fitted as a classifier of one class per value without
    a word (149 classes in 1000 rows: accuracy 0.23, where a regressor scored
    R^2 0.74).  Called by a classifier's ``fit``, once."""
    n = len(classes)
    if np.asarray(classes).dtype.kind in "iuf" and n > 50 and n > n_rows / 20:
        warnings.warn(f"y has {n} classes in {n_rows} rows: if it is a quantity, not a "
                      "label, fit a regressor (dkernel fit --task regression)", UserWarning,
                      stacklevel=user_stacklevel())


def refuse_eager_output(est: Any, X: Any) -> None:
    """Refuse lazy input to a ``transform`` that scikit-learn's ``set_output``
    (or ``set_config(transform_output=...)``) wraps in a DataFrame: the wrap
    computed every row into client memory, a store larger than the client too."""
    if is_in_memory(X):
        return
    import sklearn

    kind = getattr(est, "_sklearn_output_config", {}).get("transform") \
        or sklearn.get_config()["transform_output"]
    if kind not in (None, "default"):
        raise ValueError(f"transform_output={kind!r} would compute every row of this lazy (dask "
                         "or store) input into a DataFrame in this process: transform an "
                         "in-memory slice, or set_output(transform='default') for lazy input")


def validate_predict_input(est: Any, X: Any, name: str = "X", finite: bool = True) -> Any:
    """X for predict / transform: in-memory input checked by scikit-learn against the
    fitted width and column names; dask arrays and store paths stay lazy.
    ``finite=False`` leaves NaN / infinity to :func:`open_dataset`, whose error
    names the first bad row (for a second sample a fit reads, not a prediction)."""
    check_not_sparse(X, name)
    if is_in_memory(X):
        return validate_data(est, _listed_as_numpy(X), reset=False, accept_sparse=False,
                             dtype=_FLOAT_DTYPES, ensure_all_finite=finite)
    return check_predict_input(X, est.n_features_in_, name)


def binary_margin(f: Any) -> Any:
    """scikit-learn's binary decision_function: one column, positive for ``classes_[1]``.
    Two one-hot / softmax score columns become their difference (the logit
    of class 1 against class 0), which ranks rows as ``predict_proba[:, 1]`` does."""
    if f.ndim == 2 and f.shape[1] == 2:
        return f[:, 1] - f[:, 0]
    return f


def labels_for_file(classes: np.ndarray) -> np.ndarray:
    """Class labels as an array a ``.npz`` stores without pickle."""
    classes = np.asarray(classes)
    if classes.dtype != object:
        return classes
    if all(isinstance(c, str) for c in classes):
        return classes.astype(str)
    raise ValueError(
        f"class labels of types {sorted({type(c).__name__ for c in classes})} cannot be saved "
        "without pickle; use str or numeric labels to save the model"
    )


def check_predict_input(X: Any, n_inputs: int, name: str = "X") -> Any:
    """Open X for prediction: a NumPy or dask array with the fitted width."""
    if isinstance(X, (str,)) or hasattr(X, "__fspath__"):
        X = open_dataset(X).X
    if isinstance(X, (list, tuple)):
        X = np.asarray(X)
    if getattr(X, "ndim", None) != 2:
        raise ValueError(f"{name} must be 2-D (n_samples, n_features), got shape "
                         f"{getattr(X, 'shape', None)}")
    if X.shape[1] != n_inputs:
        raise ValueError(
            f"{name} has {X.shape[1]} features but the model was fitted on {n_inputs}; "
            "predict on data with the same columns as the training data"
        )
    if isinstance(X, np.ndarray):
        open_dataset(X)  # dtype / emptiness / NaN checks
    return X


#: Above this many bytes a lazy prediction graph gets the model's arrays as
#: one scattered future instead of embedded: kernel-form EigenPro's centers on
#: Fashion-MNIST are 188 MB, which every compute would send through the
#: scheduler (Dask warns "Sending large graph" past 10 MB).
_GRAPH_EMBED_BYTES = 8 << 20


def _arrays(value: dict) -> Iterator[np.ndarray]:
    """The arrays of a model dict, nested ones included (prepared centers)."""
    for v in value.values():
        if isinstance(v, np.ndarray):
            yield v
        elif isinstance(v, dict):
            yield from _arrays(v)


def graph_value(value: dict) -> Any:
    """``value`` (a dict of model arrays) as an argument of a lazy graph's tasks.

    Small values are embedded.  Large ones go to the cluster once, scattered
    with the running default client -- the one ``compute`` will use -- and the
    graph refers to them; the lazy result then needs that client open when it
    is computed.  With no running client (the threaded scheduler, or the fit's
    client closed since) they are embedded as well."""
    nbytes = sum(v.nbytes for v in _arrays(value))
    if nbytes > _GRAPH_EMBED_BYTES:
        from distributed import default_client

        try:
            client = default_client()
        except ValueError:  # no distributed client: nothing to scatter to
            client = None
        if client is not None and client.status == "running":
            # under a key that says what to do: the graph computed without this
            # client (closed, or dask.config scheduler="sync") fails in Dask's
            # words, "Missing dependency <key>", before any dkernel code runs
            key = f"dkernel-model-{tokenize(value)}-compute-with-its-client-open"
            return scatter(client, {key: value})[key]
    return dask.delayed(value, pure=True)


def _finite_then(fn: Callable[[Any], Any], Xb: Any, block_info: dict | None = None) -> Any:
    start = block_info[0]["array-location"][0][0] if block_info else 0
    # rows of unknown count (a boolean-masked dask X) have no global number
    check_finite_chunk(Xb, "X", None if math.isnan(start) else int(start), "predicting")
    return fn(Xb)


def balanced_rows(X: da.Array) -> da.Array:
    """X with row chunks longer than ``max(_PIECE_ROWS, n / _PIECES)`` split
    (never merged: reads stay aligned to the store's chunks), so that a
    prediction over a few large chunks spreads over the cluster.  Fashion-MNIST's
    test store is 8192 + 1808 rows: one worker did 82% of EigenPro's kernel-form
    evaluation, 17.1 s where the arithmetic on two workers needs about 8 s.  The
    pieces depend on X alone, never on the cluster, so a prediction rounds the
    same on any cluster (BLAS may sum a block of another height in another
    order)."""
    rows = X.chunks[0]
    if any(math.isnan(n) for n in rows):  # unknown sizes (a dataframe's): as given
        return X
    size = max(_PIECE_ROWS, math.ceil(X.shape[0] / _PIECES))
    if max(rows, default=0) <= size:
        return X
    pieces = tuple(min(size, n - i) for n in rows for i in range(0, n, size))
    return X.rechunk({0: pieces})


#: Rows a prediction block may have before it is split, unless the input is so
#: large that ``_PIECES`` blocks of that size would not cover it (a store of
#: many chunks is spread over the cluster already).
_PIECE_ROWS = 1024
_PIECES = 64


def apply_rows(fn: Callable[[Any], Any], X: Any, n_out: int | None, dtype: Any,
               tile_rows: int = 4096) -> Any:
    """Apply a row-wise function: lazily (map_blocks) on dask input, tile by tile on NumPy.

    Lazy blocks are checked for NaN / infinity first (NumPy input was checked
    when it was opened): a store's bad row stops the prediction with its
    number instead of turning into a NaN prediction or score."""
    if isinstance(X, da.Array):
        if len(X.chunks[1]) > 1:
            X = X.rechunk({1: -1})
        rows, X = X.chunks[0], balanced_rows(X)
        fn = partial(_finite_then, fn)
        if n_out is None:
            out = X.map_blocks(fn, drop_axis=1, dtype=dtype)
        else:
            out = X.map_blocks(fn, chunks=(X.chunks[0], (n_out,)), dtype=dtype)
        return out if out.chunks[0] == rows else out.rechunk({0: rows})  # the input's chunks
    parts = [fn(X[i : i + tile_rows]) for i in range(0, X.shape[0], tile_rows)]
    return np.concatenate(parts, axis=0)
