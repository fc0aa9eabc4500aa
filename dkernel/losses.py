"""Losses l(f, y) and their derivatives dl/df (Dai et al. 2014, section 4).

Every loss works elementwise on ``(m, c)`` score arrays, except ``softmax``
which couples the c columns of a row.  Targets arrive already encoded by the
estimator: regression targets as floats, binary/one-vs-rest targets as
+-1, softmax targets as one-hot rows.  All functions keep the input dtype.
"""

from __future__ import annotations

from typing import Any, Callable

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


def huber(f: Any, y: Any, delta: float = 1.0) -> tuple[Any, Any]:
    """l = r^2/2 for |r| <= delta, delta(|r| - delta/2) beyond."""
    xp = namespace(f)
    r = f - y
    a = xp.abs(r)
    inside = a <= delta
    value = xp.where(inside, 0.5 * r * r, delta * (a - 0.5 * delta))
    return value, xp.where(inside, r, delta * xp.sign(r))


def epsilon_insensitive(f: Any, y: Any, epsilon: float = 0.1) -> tuple[Any, Any]:
    """Support vector regression: l = max(0, |f - y| - eps)."""
    xp = namespace(f)
    r = f - y
    a = xp.abs(r) - epsilon
    return xp.maximum(a, 0), xp.sign(r) * (a > 0).astype(f.dtype)


def quantile(f: Any, y: Any, tau: float = 0.5) -> tuple[Any, Any]:
    """Pinball loss: l = max(tau (y - f), (tau - 1)(y - f))."""
    xp = namespace(f)
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


def get_loss(name: str) -> LossFn:
    try:
        return LOSSES[name]
    except KeyError:
        raise ValueError(f"loss={name!r} is not supported; choose one of {', '.join(LOSSES)}") from None
