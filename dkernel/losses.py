"""Losses l(f, y) and their derivatives dl/df (Dai et al. 2014, section 4).

Every loss works elementwise on ``(m, c)`` score arrays, except ``softmax``
which couples the c columns of a row.  Targets arrive already encoded by the
estimator: regression targets as floats, binary/one-vs-rest targets as
+-1, softmax targets as one-hot rows.  All functions keep the input dtype.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial
from typing import Any

from dkernel.backend import namespace

LossFn = Callable[[Any, Any], tuple[Any, Any]]


def squared(f: Any, y: Any) -> tuple[Any, Any]:
    """Kernel ridge regression: l = (f - y)^2 / 2, l' = f - y."""
    r = f - y
    return 0.5 * r * r, r


def hinge(f: Any, y: Any) -> tuple[Any, Any]:
    """SVM: l = max(0, 1 - y f), l' = -y [y f < 1]."""
    xp = namespace(f)
    margin = 1 - y * f
    return xp.maximum(margin, 0), -y * (margin > 0).astype(f.dtype)


def squared_hinge(f: Any, y: Any) -> tuple[Any, Any]:
    """l = max(0, 1 - y f)^2 / 2, l' = -y max(0, 1 - y f)."""
    xp = namespace(f)
    m = xp.maximum(1 - y * f, 0)
    return 0.5 * m * m, -y * m


def logistic(f: Any, y: Any) -> tuple[Any, Any]:
    """l = log(1 + exp(-y f)), l' = -y sigmoid(-y f); computed without overflow."""
    xp = namespace(f)
    z = -y * f
    value = xp.logaddexp(0, z)
    return value, -y * xp.exp(z - value)


def softmax(f: Any, y: Any) -> tuple[Any, Any]:
    """Multinomial logistic: l = logsumexp(f) - <y, f>, l' = softmax(f) - y."""
    xp = namespace(f)
    z = f - f.max(axis=1, keepdims=True)
    lse = xp.log(xp.exp(z).sum(axis=1, keepdims=True))
    p = xp.exp(z - lse)
    value = (lse - (y * z).sum(axis=1, keepdims=True)) / f.shape[1]
    return xp.broadcast_to(value, f.shape), p - y


def huber(f: Any, y: Any, epsilon: float = 0.1) -> tuple[Any, Any]:
    """Robust regression (Dai et al. section 4 with threshold 1; ``epsilon`` as in
    scikit-learn's ``SGDRegressor``): l = r^2/2 for |r| <= epsilon,
    epsilon (|r| - epsilon/2) beyond; l' = r inside, epsilon sign(r) beyond."""
    xp = namespace(f)
    r = f - y
    a = xp.abs(r)
    inside = a <= epsilon
    eps = f.dtype.type(epsilon)
    value = xp.where(inside, 0.5 * r * r, eps * (a - 0.5 * eps))
    return value, xp.where(inside, r, eps * xp.sign(r))


def epsilon_insensitive(f: Any, y: Any, epsilon: float = 0.1) -> tuple[Any, Any]:
    """Support vector regression: l = max(0, |f - y| - epsilon), l' = sign(f - y)
    outside the tube; epsilon = 0 is least absolute deviation (Dai et al. section 4)."""
    xp = namespace(f)
    r = f - y
    a = xp.abs(r) - f.dtype.type(epsilon)
    return xp.maximum(a, 0), xp.sign(r) * (a > 0).astype(f.dtype)


def quantile(f: Any, y: Any, quantile: float = 0.5) -> tuple[Any, Any]:
    """Pinball loss at level tau = ``quantile`` (scikit-learn's ``QuantileRegressor``
    name): l = max(tau (y - f), (tau - 1)(y - f)); l' = 1 - tau if f >= y else -tau
    (Dai et al. section 4).  Its minimiser is the tau-quantile of y given x."""
    xp = namespace(f)
    tau = f.dtype.type(quantile)
    r = y - f
    value = xp.maximum(tau * r, (tau - 1) * r)
    return value, xp.where(r > 0, -tau, 1 - tau).astype(f.dtype)


LOSSES: dict[str, LossFn] = {
    "squared": squared,
    "hinge": hinge,
    "squared_hinge": squared_hinge,
    "logistic": logistic,
    "softmax": softmax,
    "huber": huber,
    "epsilon_insensitive": epsilon_insensitive,
    "quantile": quantile,
}
REGRESSION_LOSSES = ("squared", "huber", "epsilon_insensitive", "quantile")
CLASSIFICATION_LOSSES = ("hinge", "squared_hinge", "logistic", "softmax")
#: Regression losses whose gradient is bounded (by 1, or huber's epsilon) whatever
#: the residual: a step moves f by a bounded amount, so it must follow y's units.
BOUNDED_GRADIENT = ("huber", "epsilon_insensitive", "quantile")


#: Parameters each loss takes, with scikit-learn's names and defaults.
LOSS_PARAMS: dict[str, dict[str, float]] = {
    "huber": {"epsilon": 0.1},
    "epsilon_insensitive": {"epsilon": 0.1},
    "quantile": {"quantile": 0.5},
}

#: A loss as it travels in a step payload and a checkpoint fingerprint: its name,
#: or for a loss with parameters ``{"name": ..., <param>: value}`` (picklable and
#: JSON-able, so workers rebuild the same function and a resume checks it).
LossSpec = str | dict[str, Any]


def loss_spec(name: str, **params: Any) -> LossSpec:
    """The spec of loss ``name`` with the parameters it takes picked from
    ``params`` (others are ignored, as scikit-learn ignores ``epsilon`` for
    the squared loss); a loss without parameters is its bare name."""
    get_loss(name)
    taken = LOSS_PARAMS.get(name)
    if not taken:
        return name
    spec: dict[str, Any] = {"name": name}
    for key, default in taken.items():
        value = params.get(key)
        spec[key] = float(default if value is None else value)
    _check_params(spec)
    return spec


def _check_params(spec: dict[str, Any]) -> None:
    name = spec["name"]
    for key, value in spec.items():
        if key == "name":
            continue
        if key not in LOSS_PARAMS.get(name, {}):
            raise ValueError(f"loss={name!r} takes no parameter {key!r}; "
                             f"it takes {', '.join(LOSS_PARAMS.get(name, {})) or 'none'}")
        if not (isinstance(value, (int, float)) and math.isfinite(value)):
            raise ValueError(f"{key} must be a finite number, got {value!r}")
    if name in ("huber", "epsilon_insensitive") and not spec["epsilon"] >= 0:
        raise ValueError(f"epsilon must be >= 0 for loss={name!r}, got {spec['epsilon']!r}")
    if name == "quantile" and not 0 < spec["quantile"] < 1:
        raise ValueError(f"quantile must be strictly between 0 and 1, got {spec['quantile']!r}")


def get_loss(spec: LossSpec) -> LossFn:
    """The loss function of a name or a spec from :func:`loss_spec`."""
    if isinstance(spec, dict):
        params = {k: v for k, v in spec.items() if k != "name"}
        fn = get_loss(spec.get("name", ""))
        _check_params(spec)
        return partial(fn, **params) if params else fn
    try:
        return LOSSES[spec]
    except (KeyError, TypeError):
        raise ValueError(
            f"loss={spec!r} is not supported; choose one of {', '.join(LOSSES)}") from None
