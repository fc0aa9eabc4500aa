"""Pictures of a fitted model: the learning curve and the spectrum.

``learning_curve`` draws ``history_`` per epoch: the training loss (or, for
the component models, the objective they maximise) and the validation score
where early stopping held rows out, with the kept epoch marked.
``spectrum`` draws what sets the model's shape: EigenPro's preconditioner
eigenvalues with q marked, the explained variance of KernelPCA /
StreamingKernelPCA, KernelCCA's correlations or KernelSVD's singular values.
``plot_model`` puts both on one figure and can write it to a PNG; it is what
``dkernel plot MODEL --out fig.png`` runs.

Needs matplotlib (``pip install 'dkernel[plot]'``).  Figures are built with
:class:`matplotlib.figure.Figure`, not pyplot, so no display is needed.
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from dkernel.estimators.history import BOOKKEEPING
from dkernel.files import expands_user

#: Per-epoch objectives of the component models, as axis labels.
_OBJECTIVES = {
    "variance": "captured variance",
    "correlation": "sum of correlations",
    "covariance": "sum of singular values",
}

#: What the legend adds to an objective, where the model's own figure differs.
#: KernelCCA's per-epoch sum is measured on the epoch's mini-batches, each with
#: the coefficients before its step, and with the plain variances of the two
#: views; correlations_ (the spectrum) are those of the final model on every
#: row with the ridge alpha added to both variances, which lowers each of
#: them.  On 6,000 rows (5 components, 512 features, alpha 0.001) the last
#: epoch's sum was 2.28, the final model's unregularised sum on every row 2.39
#: and the regularised correlations_ summed to 1.95.
_OBJECTIVE_NOTES = {
    "correlation": "on each epoch's batches, without the alpha ridge",
}


def _matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ImportError(
            "dkernel.plot needs matplotlib; install it with pip install 'dkernel[plot]'"
        ) from None
    return matplotlib


def check_image_path(path: str | os.PathLike, flag: str = "path") -> None:
    """Refuse an image path whose extension names no format matplotlib writes:
    without one it wrote ``path + ".png"``, beside the path that was checked
    for an existing file and reported."""
    _matplotlib()
    from matplotlib.backend_bases import FigureCanvasBase

    formats = sorted(FigureCanvasBase.get_supported_filetypes())
    suffix = os.path.splitext(os.fspath(path))[1].lstrip(".").lower()
    if suffix not in formats:
        raise ValueError(f"{flag} {os.fspath(path)!r} needs an image extension that picks the "
                         f"format: .png, .svg, .pdf or another of {', '.join(formats)}")


def _model(model: Any) -> Any:
    if isinstance(model, (str, os.PathLike)):
        from dkernel.io import load_model

        return load_model(model)
    return model


def _new_axes(ax: Any) -> Any:
    if ax is not None:
        return ax
    _matplotlib()
    from matplotlib.figure import Figure

    return Figure(figsize=(5, 3.5), layout="constrained").add_subplot()


def learning_curve(model: Any, ax: Any = None) -> Any:
    """Draw the per-epoch history of a fitted model (or a model file).

    Parameters
    ----------
    model : estimator or path
        A fitted dkernel estimator, or a model file written by ``save``.
    ax : matplotlib Axes, optional
        Where to draw; None: a new figure.

    Returns
    -------
    matplotlib Axes
    """
    model = _model(model)
    history = getattr(model, "history_", None)
    if not history:
        raise ValueError(
            f"this {type(model).__name__} has no training history (history_); "
            "models saved by older dkernel versions have none: refit to get one"
        )
    ax = _new_axes(ax)
    # EigenPro's all-rows (FALKON) solve records conjugate-gradient iterations
    xkey = "epoch" if "epoch" in history[0] else "iteration"
    epochs = np.array([e[xkey] for e in history])
    series = _series(history)
    series.pop(xkey, None)
    left = [k for k in series if k != "validation_score"]
    colors = iter(["C0", "C2", "C3", "C4"])
    handles = []
    names = []
    for key in left:
        name = "training loss" if key == "loss" else _OBJECTIVES.get(key, key.replace("_", " "))
        names.append(name)
        label = f"{name} ({_OBJECTIVE_NOTES[key]})" if key in _OBJECTIVE_NOTES else name
        handles += ax.plot(epochs, series[key], "o-", color=next(colors), label=label)
    ax.set_xlabel("epoch" if xkey == "epoch" else "conjugate-gradient iteration")
    if left:
        ax.set_ylabel(", ".join(names))
        if "loss" in left and _positive(series["loss"]) and _spread(series["loss"]) > 10:
            ax.set_yscale("log")
    if "validation_score" in series:
        task = "accuracy" if hasattr(model, "classes_") else "R$^2$"
        vax = ax.twinx() if left else ax
        handles += vax.plot(
            epochs, series["validation_score"], "s--", color="C1", label=f"validation {task}"
        )
        vax.set_ylabel(f"validation {task}")
    best = getattr(model, "best_epoch_", None)
    if best is not None:
        handles.append(ax.axvline(best, color="0.5", linestyle=":", label=f"kept: epoch {best}"))
    ax.set_xticks(epochs if len(epochs) <= 12 else np.linspace(epochs[0], epochs[-1], 6).round())
    ax.set_title(f"{type(model).__name__}: learning curve")
    # below the plot: with two y axes no corner is free of both curves
    ax.legend(
        handles=handles,
        fontsize="small",
        loc="upper center",
        bbox_to_anchor=(0.5, -0.18),
        ncol=min(3, len(handles)),
        frameon=False,
    )
    return ax


def _series(history: list[dict]) -> dict[str, np.ndarray]:
    """Numeric per-epoch columns (None -> NaN), bookkeeping and empty ones left out."""
    keys: list[str] = []
    for entry in history:
        keys += [k for k in entry if k not in BOOKKEEPING and k not in keys]
    out = {}
    for k in keys:
        values = [e.get(k) for e in history]
        if all(v is None or isinstance(v, (int, float)) for v in values):
            arr = np.array([np.nan if v is None else float(v) for v in values])
            if np.isfinite(arr).any():
                out[k] = arr
    return out


def _positive(a: np.ndarray) -> bool:
    a = a[np.isfinite(a)]
    return a.size > 0 and bool((a > 0).all())


def _spread(a: np.ndarray) -> float:
    a = a[np.isfinite(a)]
    return float(a.max() / a.min())


def has_spectrum(model: Any) -> bool:
    """Whether :func:`spectrum` has something to draw for this model."""
    return any(
        hasattr(model, a)
        for a in ("eigenvalues_", "explained_variance_", "correlations_", "singular_values_")
    )


def spectrum(model: Any, ax: Any = None) -> Any:
    """Draw the eigen-spectrum (EigenPro, with q marked), the explained
    variance (KernelPCA, StreamingKernelPCA), the canonical correlations
    (KernelCCA) or the singular values (KernelSVD) of a fitted model.

    Returns
    -------
    matplotlib Axes
    """
    model = _model(model)
    if not has_spectrum(model):
        raise ValueError(f"{type(model).__name__} has no spectrum to draw")
    ax = _new_axes(ax)
    name = type(model).__name__
    if hasattr(model, "eigenvalues_"):
        lam, q = np.asarray(model.eigenvalues_), int(model.q_)
        i = np.arange(1, lam.size + 1)
        ax.semilogy(i, lam, "o-", color="C0", markersize=3, label=r"$\lambda_i$")
        ax.axvline(q, color="C3", linestyle=":", label=f"q = {q}")
        ax.axhline(
            lam[q],
            color="0.5",
            linestyle="--",
            label=rf"top {q} flattened to $\lambda_{{q+1}}$ = {lam[q]:.3g}",
        )
        ax.set_xlabel("eigenvalue index i")
        ax.set_ylabel("eigenvalue")
        ax.set_title(f"{name}: preconditioner spectrum")
        ax.legend(fontsize="small")
        return ax
    attr, label = next(
        (a, text)
        for a, text in (
            ("explained_variance_", "explained variance"),
            ("correlations_", "canonical correlation"),
            ("singular_values_", "singular value"),
        )
        if hasattr(model, a)
    )
    values = np.asarray(getattr(model, attr))
    i = np.arange(1, values.size + 1)
    ax.bar(i, values, color="C0")
    ax.set_xlabel("component")
    ax.set_ylabel(label)
    ax.set_xticks(i if i.size <= 12 else np.linspace(1, i.size, 6).round())
    title = f"{name}: {label} (sum {values.sum():.3g})"
    if attr == "correlations_":  # not the learning curve's sum: see _OBJECTIVE_NOTES
        title += f"\nfinal model, every row, ridge alpha = {float(model.alpha):g}"
    ax.set_title(title)
    return ax


@expands_user("path")
def plot_model(model: Any, path: str | os.PathLike | None = None, *, dpi: int = 100) -> Any:
    """The learning curve and, where the model has one, the spectrum side by
    side; written to ``path`` (PNG, or any format matplotlib knows by the
    extension) when given.

    Parameters
    ----------
    model : estimator or path
        A fitted dkernel estimator or a model file.
    path : str, optional
        Image file to write.
    dpi : int, default=100

    Returns
    -------
    matplotlib Figure
    """
    _matplotlib()
    from matplotlib.figure import Figure

    if path is not None:
        check_image_path(path)
    model = _model(model)
    panels = [
        p
        for p, ok in (
            (learning_curve, bool(getattr(model, "history_", None))),
            (spectrum, has_spectrum(model)),
        )
        if ok
    ]
    if not panels:
        raise ValueError(
            f"this {type(model).__name__} has neither a training history nor a "
            "spectrum to draw; refit it with this dkernel version"
        )
    fig = Figure(figsize=(5 * len(panels), 3.6), layout="constrained")
    for ax, draw in zip(fig.subplots(1, len(panels), squeeze=False)[0], panels):
        draw(model, ax)
    if path is not None:
        fig.savefig(os.fspath(path), dpi=dpi)
    return fig
