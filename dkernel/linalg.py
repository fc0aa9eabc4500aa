r"""Distributed top eigensystems of lazily generated tall matrices.

A tall matrix ``T`` (n x N) is never materialised: each row chunk of the data
regenerates its block ``T_c = block(params, X_c)`` on the worker that holds
the chunk (random features Phi(X_c), or kernel columns K(X_c, Z)), and every
pass over T is one :meth:`dkernel.engine.Engine.map_reduce` whose partial
results are N x r (or N x N) sums.  Two symmetric PSD operators are covered:

``"gram"``  A = T^T T / n                   (feature covariance, EigenPro-RF);
            with ``center=True`` the covariance about the column mean mu,
            A = T^T T / n - mu mu^T (mu is summed in the same pass: the
            correction mu (mu^T Q) needs no extra read)
``"rows"``  A = T / n with T symmetric,      (K(S, S) / s of the EigenPro
            its rows the data rows            kernel form; y_c holds each row's
                                              index in S)

Two methods:

``dense``       A is summed on the workers (``gram``: T_c^T T_c; ``rows``: the
                row blocks, placed by index) and its top pairs are taken with
                :func:`scipy.linalg.eigh` -- exact; N up to a few thousand.
                A ``gram`` of fewer rows than columns (n < N: a small sample,
                a wide pool) gathers T itself and solves the n x n T T^T / n,
                whose nonzero eigenvalues are A's, with A's eigenvectors
                v = T^T w / |T^T w|: the same pairs from an order-n eigh
                (KernelCCA's preconditioners, 4096 features on 2000 rows:
                0.5 s each against 3.1 s at order 4096).
``randomized``  Halko, Martinsson & Tropp (2011) Alg. 4.4 + 5.3 for a
                symmetric operator: Y = A Omega (Omega N x (k + p) Gaussian),
                ``n_iter`` power steps Q <- orth(A Q), then Rayleigh-Ritz
                B = Q^T A Q (r x r, eigh).  Each product A Q is one reduction
                over the row chunks: ``gram``: sum_c T_c^T (T_c Q);
                ``rows``: sum_c T_c^T Q[idx_c] (A symmetric).

Only the small problems (N x N for dense, r x r for randomized) are solved on
the coordinator, with LAPACK's symmetric solver (no iterative eigensolver
that can stall).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.linalg

from dkernel.backend import namespace, to_numpy

#: A block function regenerates T_c on a worker: ``block(params, X_c) -> (rows, N)``.
BlockFn = Callable[[Any, Any], Any]


@dataclass
class Eigensystem:
    """Top eigenpairs of a symmetric PSD operator, eigenvalues descending."""

    values: np.ndarray  # (k,)
    vectors: np.ndarray  # (N, k), orthonormal columns
    method: str
    #: max_i |T_i|^2 over the rows of T (``gram`` only; about the mean with
    #: ``center``): beta of the EigenPro step size.
    row_norm_max: float | None = None
    #: (n, k) the eigenvectors w of the order-n T T^T / n (:func:`wide_gram_eigensystem`
    #: only): orthonormal where ``vectors``' T^T w / |T^T w| are not once lambda is
    #: at rounding level, so sums over the rows (the GP amplitude) read them instead.
    gram_vectors: np.ndarray | None = None


def top_eigh(A: np.ndarray, k: int, dtype: str = "float64") -> tuple[np.ndarray, np.ndarray]:
    """Top ``k`` eigenpairs of a dense symmetric matrix (descending), LAPACK ``evr`` (``evd``
    when k is over a third of the order);
    ``dtype="float32"`` solves in single precision (about 5x faster on these
    machines; eigenvalues to ~1e-7 of lambda_1), returned as float64."""
    A = np.asarray(A, dtype=np.dtype(dtype))
    N = A.shape[0]
    k = min(int(k), N)
    if 3 * k > N:
        # most of the spectrum: the full divide-and-conquer solve is faster
        # (1537 of 2048 pairs in float32: evd 1.8 s, evr 3.3 s here)
        w, V = scipy.linalg.eigh(A, driver="evd", check_finite=False)
        w, V = w[N - k :], V[:, N - k :]
    else:
        w, V = scipy.linalg.eigh(A, subset_by_index=[N - k, N - 1], driver="evr",
                                 check_finite=False)
    return w[::-1].astype(np.float64), V[:, ::-1].astype(np.float64)


def column_signs(components: np.ndarray) -> np.ndarray:
    """+1 or -1 per column, making each column's largest-magnitude entry
    positive (scikit-learn's ``svd_flip``).  An eigensolver leaves each
    eigenvector's sign to rounding, so without a convention a fit on another
    machine (another BLAS) could return a component, and its scores, negated."""
    C = np.asarray(components)
    if C.size == 0:
        return np.ones(C.shape[-1] if C.ndim else 0)
    top = C[np.argmax(np.abs(C), axis=0), np.arange(C.shape[1])]
    return np.where(top < 0, -1.0, 1.0)


# --- worker side ---------------------------------------------------------------
def _row_norm_max(T: Any, mu: np.ndarray | None) -> float:
    """max_i |T_i - mu|^2 (mu None: 0), as |T_i|^2 - 2 T_i.mu + |mu|^2 without a copy of T."""
    sq = (T * T).sum(axis=1)
    if mu is not None:
        m = namespace(T).asarray(mu, dtype=T.dtype)
        sq = sq - 2 * (T @ m) + float(mu @ mu)
    return float(sq.max())


def _gram_partial(payload: dict, X: Any, y: Any) -> dict:
    T = payload["block"](payload["params"], X)
    if payload.get("dtype") == "float32":
        # products and the (few) cross-chunk sums in float32: half the bytes to
        # page in, ship and add, and the eigensolve is float32 anyway
        return {"A": to_numpy(T.T @ T), "S": to_numpy(T.sum(axis=0)).astype(np.float64),
                "norm": [_row_norm_max(T, None)], "count": X.shape[0]}
    T64 = to_numpy(T).astype(np.float64, copy=False)
    return {"A": T64.T @ T64, "S": T64.sum(axis=0), "norm": [_row_norm_max(T64, None)],
            "count": X.shape[0]}


def _tall_partial(payload: dict, X: Any, y: Any) -> dict:
    T = to_numpy(payload["block"](payload["params"], X))
    return {"rows": [T.astype(np.dtype(payload["dtype"]), copy=False)], "count": X.shape[0]}


def _norm_partial(payload: dict, X: Any, y: Any) -> dict:
    T = payload["block"](payload["params"], X)
    return {"norm": [_row_norm_max(T, payload.get("mu"))], "count": X.shape[0]}


def _rows_partial(payload: dict, X: Any, y: Any) -> dict:
    T = to_numpy(payload["block"](payload["params"], X)).astype(np.float64, copy=False)
    idx = np.asarray(to_numpy(y)).reshape(-1).astype(np.int64)
    return {"idx": [idx], "rows": [T], "count": X.shape[0]}


#: Bytes of T a product A Q regenerates at a time: a chunk's rows go through in
#: tiles of a few MB (as solvers/fused.py's passes), where T of the whole chunk
#: was rows x N at once (1 GB for a 65536-row chunk at N = 4096) and paged in
#: afresh on every pass (docs/design.md §4).
_TILE_BYTES = 4 << 20


def _gram_apply(payload: dict, X: Any, y: Any) -> dict:
    Q0 = payload["Q"]
    rows = max(64, _TILE_BYTES // (4 * Q0.shape[0]))
    Y = S = None
    norm = 0.0
    for a in range(0, X.shape[0], rows):
        T = payload["block"](payload["params"], X[a:a + rows])
        if Y is None:
            xp = namespace(T)
            Q = xp.asarray(Q0, dtype=T.dtype)
            Y, S = T.T @ (T @ Q), T.sum(axis=0)
        else:
            Y += T.T @ (T @ Q)
            S += T.sum(axis=0)
        norm = max(norm, _row_norm_max(T, payload.get("mu")))
    return {"Y": to_numpy(Y).astype(np.float64), "S": to_numpy(S).astype(np.float64),
            "norm": [norm], "count": X.shape[0]}


def _gram_apply_chunk(payload: dict, chunk: Any) -> dict:
    """:func:`_gram_apply` for a block function that takes the engine's chunk
    (``payload["chunked"]``): it may keep T_c on the worker between passes."""
    T = payload["block"](payload["params"], chunk)
    xp = namespace(T)
    Q = xp.asarray(payload["Q"], dtype=T.dtype)
    # Y in T's precision (float32): the product is computed in it anyway, and the
    # N x r partials (35 MB in float64 at N = 8192) are what a pass ships and adds
    return {"Y": to_numpy(T.T @ (T @ Q)),
            "S": to_numpy(T.sum(axis=0)).astype(np.float64),
            "norm": [_row_norm_max(T, payload.get("mu"))], "count": chunk.X.shape[0]}


def _rows_apply(payload: dict, X: Any, y: Any) -> dict:
    T = payload["block"](payload["params"], X)
    xp = namespace(T)
    idx = np.asarray(to_numpy(y)).reshape(-1).astype(np.int64)
    Qc = xp.asarray(payload["Q"][idx], dtype=T.dtype)
    return {"Y": to_numpy(T.T @ Qc).astype(np.float64), "count": X.shape[0]}


# --- coordinator side ----------------------------------------------------------
def dense_eigensystem(engine: Any, data: Any, block: BlockFn, params: Any, k: int, *,
                      operator: str = "gram", center: bool = False,
                      label: str = "eigensystem", dtype: str = "float64",
                      n_inputs: int | None = None) -> Eigensystem:
    """Top ``k`` eigenpairs of A (see module docstring), A summed on the workers.

    ``dtype="float32"`` forms and sums the chunks' T^T T in float32 (about 2x
    the GEMM speed, half the memory and traffic) and solves in float32; for
    ``operator="rows"`` (rows computed in float32 anyway) it sets the solve's
    precision only.  ``n_inputs`` (N) greater than the rows selects the
    order-n solve of a ``gram`` (module docstring)."""
    _check_operator(operator, center)
    n = data.n_rows
    if operator == "gram" and n_inputs is not None and k <= n < n_inputs:
        parts = engine.map_reduce(data, _tall_partial, {"block": block, "params": params,
                                                        "dtype": dtype}, label=label)
        return wide_gram_eigensystem(np.concatenate(parts["rows"]), k, center, dtype)
    if operator == "gram":
        total = engine.map_reduce(data, _gram_partial, {"block": block, "params": params,
                                                        "dtype": dtype}, label=label)
        A = total["A"] / n
        norm = max(total["norm"])
        if center:
            mu = total["S"] / n
            A -= np.outer(mu, mu)
            payload = {"block": block, "params": params, "mu": mu}
            norm = max(engine.map_reduce(data, _norm_partial, payload, label=label)["norm"])
        w, V = top_eigh(A, k, dtype)
        return Eigensystem(w, V, "dense", norm)
    else:
        total = engine.map_reduce(data, _rows_partial, {"block": block, "params": params},
                                  label=label)
        A = np.empty((n, total["rows"][0].shape[1]))
        for idx, rows in zip(total["idx"], total["rows"]):
            A[idx] = rows
        A /= n
        A = 0.5 * (A + A.T)  # exact symmetry for eigh (rows were computed in float32)
    w, V = top_eigh(A, k, dtype)
    return Eigensystem(w, V, "dense")


def wide_gram_eigensystem(T: np.ndarray, k: int, center: bool, dtype: str) -> Eigensystem:
    """Top ``k`` pairs of A = T^T T / n (about the column mean with ``center``)
    for n < N, from the order-n matrix T T^T / n: A's nonzero eigenvalues are
    its eigenvalues, and A v = lambda v for v = T^T w / |T^T w|.  The columns
    past the rank (a centred T has rank n - 1 at most) are rounding noise,
    scaled to unit length as the full solve's arbitrary null vectors are."""
    n = T.shape[0]
    if center:
        T = T - T.mean(axis=0, dtype=np.float64).astype(T.dtype)
    norm = float((T * T).sum(axis=1).max())
    w, W = top_eigh(T @ T.T / n, min(k, n), dtype)
    V = T.T.astype(np.float64, copy=False) @ W
    V /= np.maximum(np.linalg.norm(V, axis=0), np.finfo(np.float64).tiny)
    return Eigensystem(np.maximum(w, 0.0), V, "dense", norm, W)


def randomized_eigensystem(engine: Any, data: Any, block: BlockFn, params: Any, k: int,
                           n_inputs: int, *, operator: str = "gram", center: bool = False,
                           n_oversamples: int = 20, n_iter: int = 2, random_state: int = 0,
                           label: str = "randomized eigensystem",
                           chunked: bool = False) -> Eigensystem:
    """Top ``k`` eigenpairs of A by a randomized range finder with power iterations.

    ``n_inputs`` is N (the width of T).  Every product A Q is one
    :meth:`map_reduce` over the row chunks (``n_iter + 2`` passes in all).
    ``chunked`` (``gram`` only): ``block(params, chunk)`` takes the engine's
    :class:`~dkernel.engine.program.Chunk`, whose key lets it keep T_c on its
    worker for the later passes.
    """
    _check_operator(operator, center)
    n = data.n_rows
    r = min(int(k) + int(n_oversamples), n_inputs)
    chunked = chunked and operator == "gram"
    fn = _gram_apply_chunk if chunked else _gram_apply if operator == "gram" else _rows_apply
    rng = np.random.default_rng([int(random_state), 0x5FD])
    Q = rng.standard_normal((n_inputs, r))

    norms: list[float] = []
    mu: np.ndarray | None = None
    passes = iter(range(1, int(n_iter) + 3))

    def apply(Q: np.ndarray) -> np.ndarray:
        nonlocal mu
        payload = {"block": block, "params": params, "Q": Q.astype(np.float32), "mu": mu}
        # each pass its own progress line: "pass 3/12", not a dozen "1/2 chunks"
        total = engine.map_reduce(data, fn, payload, wants_chunk=chunked,
                                  label=f"{label} pass {next(passes)}/{int(n_iter) + 2}")
        if not center or mu is not None:  # centred norms need mu from a previous pass
            norms.extend(total.get("norm", []))
        AQ = np.asarray(total["Y"], dtype=np.float64) / n
        if center:
            mu = total["S"] / n
            AQ -= np.outer(mu, mu @ Q)
        return AQ

    # scipy's economic QR: the same LAPACK factorisation as numpy's, 0.27 s against
    # 0.39 s for 8192 x 533 here
    Q = scipy.linalg.qr(apply(Q), mode="economic", check_finite=False)[0]
    for _ in range(int(n_iter)):  # HMT Alg. 4.4 (re-orthonormalised power steps)
        Q = scipy.linalg.qr(apply(Q), mode="economic", check_finite=False)[0]
    AQ = apply(Q)
    B = Q.T @ AQ
    w, U = top_eigh(0.5 * (B + B.T), k)  # Rayleigh-Ritz (HMT Alg. 5.3)
    return Eigensystem(w, Q @ U, "randomized", max(norms) if norms else None)


#: Largest order :func:`eigensystem` solves densely when ``method="auto"``.
DENSE_MAX = 4096


def eigensystem(engine: Any, data: Any, block: BlockFn, params: Any, k: int, n_inputs: int, *,
                operator: str = "gram", center: bool = False, method: str = "auto",
                dense_max: int = DENSE_MAX,
                random_state: int = 0, n_oversamples: int = 20, n_iter: int = 2,
                label: str = "eigensystem", dtype: str = "float64",
                chunked: bool = False) -> Eigensystem:
    """``method="auto"``: dense when N <= ``dense_max`` (exact, one pass), else randomized.
    ``dtype`` is the dense Gram's product precision (:func:`dense_eigensystem`);
    ``chunked`` as :func:`randomized_eigensystem` (a dense solve reads T once and
    calls ``block`` with the rows)."""
    if method not in ("auto", "dense", "randomized"):
        raise ValueError(f"method={method!r}; choose 'auto', 'dense' or 'randomized'")
    if method == "dense" or (method == "auto" and n_inputs <= dense_max):
        return dense_eigensystem(engine, data, block, params, k, operator=operator, center=center,
                                 label=label, dtype=dtype, n_inputs=n_inputs)
    return randomized_eigensystem(engine, data, block, params, k, n_inputs, operator=operator,
                                  center=center,
                                  n_oversamples=n_oversamples, n_iter=n_iter,
                                  random_state=random_state, label=label, chunked=chunked)


def _check_operator(operator: str, center: bool = False) -> None:
    if operator not in ("gram", "rows"):
        raise ValueError(f"operator={operator!r}; choose 'gram' (T^T T / n) or 'rows' "
                         "(T / n, T symmetric)")
    if center and operator != "gram":
        raise ValueError("center=True applies to operator='gram' (a covariance) only")
