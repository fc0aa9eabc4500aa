"""Every public parameter of the estimators, declared once: default,
constraint, doc and CLI flag (:class:`~dkernel.estimators.params.Param`),
grouped as kernel, feature pool, SGD, early stopping and runtime, then the
model-specific ones.  :data:`ESTIMATORS` lists each estimator's parameters in
signature order with its own defaults and docs where they differ (KernelCCA's
``lanes=4`` and ``batch_size=512``, EigenPro's ``n_epochs=10``); the
signatures, the docstrings' Parameters sections, validation and
``dkernel fit``'s flags all come from it (tests/test_spec.py checks the
signatures against it)."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from dkernel.estimators.params import (
    AUTO,
    Param,
    anything,
    auto_or,
    boolean,
    custom,
    int_sequence,
    integer,
    none_or,
    number,
    numbers_or_number,
    one_of,
)


def _kernel(_: str, value: Any) -> None:
    from dkernel.kernels.exact import check_kernel

    check_kernel(value)


def _kernel_y(_: str, value: Any) -> None:
    from dkernel.kernels.exact import check_kernel

    check_kernel(value, "kernel_y")


def check_random_state_param(random_state: Any) -> None:
    """None, a non-negative int, ``np.random.RandomState`` or ``np.random.Generator``."""
    if random_state is None or isinstance(random_state,
                                          (np.random.RandomState, np.random.Generator)):
        return
    if not isinstance(random_state, (int, np.integer)) or isinstance(random_state, bool) \
            or random_state < 0:
        raise ValueError(
            "random_state must be None, a non-negative integer seed, a numpy.random.RandomState "
            f"or a numpy.random.Generator, got {random_state!r}")


_KERNEL_KIND = '{"gaussian", "laplacian", "cauchy"}'

# kernel ---------------------------------------------------------------------------
KERNEL = Param("kernel", "gaussian", _KERNEL_KIND, custom(_kernel, str), """\
    Kernel of the model, with s the ``bandwidth``: "gaussian"
    exp(-|x - z|_2^2 / (2 s^2)) (scikit-learn's rbf_kernel with gamma =
    1 / (2 s^2)); "laplacian" exp(-|x - z|_1 / s) (laplacian_kernel, gamma =
    1 / s); "cauchy" prod_j 1 / (1 + (x_j - z_j)^2 / s^2).  The same function
    on every route: random features, kernel rows, centers.""", "kernel")
#: Below it the gaussian's 1 / (2 s^2) overflows float32: every kernel value
#: was NaN or 0, and a fit failed far from the cause (EigenPro: "cannot
#: convert float NaN to integer").
_MIN_BANDWIDTH = 1e-18
BANDWIDTH = Param("bandwidth", AUTO, 'float or "auto"',
                  auto_or(number(_MIN_BANDWIDTH, low_open=False, shown=">= 1e-18")), """\
    Kernel scale s (see ``kernel``); "auto" is the median heuristic on a
    1000-row sample: the median distance between its rows, L2 over sqrt(2)
    for "gaussian" and "cauchy", L1 for "laplacian".  Stored as
    ``bandwidth_``.""", "kernel")
KERNEL_Y = Param("kernel_y", None, "str, optional", none_or(custom(_kernel_y, str)),
                 "Kernel of the second view (None: same as ``kernel``).", "kernel")
BANDWIDTH_Y = Param("bandwidth_y", None, 'float or "auto", optional',
                    none_or(auto_or(number(_MIN_BANDWIDTH, low_open=False, shown=">= 1e-18"))), """\
    Bandwidth of the second view.  None: ``bandwidth``, so a number applies to
    both views as it is (whatever Y's scale) and "auto" is the median heuristic
    on Y's rows.""", "kernel")

# feature pool ------------------------------------------------------------------------
N_FEATURES = Param("n_features", 4096, "int", integer(), """\
    Size D of the feature pool: after D / block_size steps, existing seeds
    are revisited (block-coordinate SGD on a fixed pool).  Rounded up to
    whole blocks; the pool's size is ``n_features_``.""", "pool", aliases=("--features",))
BLOCK_SIZE = Param("block_size", 256, "int", integer(),
                   "Features B drawn per step (one seed).", "pool")
FEATURE_CACHE = Param("feature_cache", AUTO, '{"auto", "float32", "fixed16", "off"}',
                      one_of(AUTO, "float32", "fixed16", "off"), """\
    Keep the feature blocks Phi_j(X_c) on the workers between epochs
    (:mod:`dkernel.solvers.feature_cache`).  "auto": float32 when every
    worker's share of the blocks and of X fits its cache budget (the
    config ``dkernel.cache-fraction`` of its memory limit, 0.4, less what
    the process holds beyond Dask's spill threshold), else fixed16
    (features as 16-bit integers, absolute error 2.2e-5) if that fits,
    else "off", and "off" for a single epoch.  "float32" / "fixed16"
    keep the blocks that fit and regenerate the rest; "off" regenerates
    every block every epoch.  Stored as ``feature_cache_``.""", "pool")
N_COMPONENTS = Param("n_components", 4, "int", integer(), "Components k.", "pool",
                     aliases=("--components",))

# SGD ---------------------------------------------------------------------------------
ALPHA = Param("alpha", 1e-6, "float", number(0.0, low_open=False),
              "Regularisation strength nu: every step shrinks old blocks by (1 - gamma nu).",
              "sgd")
BATCH_SIZE = Param("batch_size", AUTO, 'int or "auto"', auto_or(integer()), """\
    Rows per step, spread over ``lanes`` chunks.  "auto" with the
    preconditioner: ``lanes`` x rows whose D features are 2^27 feature
    evaluations (65536 rows at D = 2048, clipped to [1024, 65536]), wide
    enough that a step's compute dwarfs its fixed cost, but past two lanes'
    rows no more than an eighth of the data (an epoch keeps 8 steps on data
    small against the cluster); without it, 512.  Stored as
    ``batch_size_``.""", "sgd")
N_EPOCHS = Param("n_epochs", 5, "int", integer(), "Passes over the data.", "sgd",
                 aliases=("--epochs",))
STEP_SIZE = Param("step_size", AUTO, 'float or "auto"', auto_or(number()), """\
    gamma_0.  "auto": with the preconditioner c_loss eta(batch) / 2, eta
    EigenPro's step for the preconditioned spectrum; without it,
    c_loss / lambda_1 with lambda_1 the top eigenvalue of the kernel
    operator on a 1000-row sample (of the model's random features' Gram
    where that is larger: a narrow bandwidth); either with alpha's curvature added,
    1 / (1 / gamma + alpha), so that the ridge term's shrink
    1 - gamma alpha stays in (0, 1); for a loss of bounded gradient (huber,
    epsilon_insensitive, quantile) c_loss is times y's spread, each output
    its own.  Stored as ``step_size_`` (a list where outputs differ).  A step
    that makes the loss blow up is undone and halved (recorded in
    ``step_backoffs_``).""", "sgd")
STEP_DECAY = Param("step_decay", 1e-3, "float", number(0.0, low_open=False),
                   "gamma_t = step_size / (1 + step_decay * t).", "sgd")
LANES = Param("lanes", AUTO, 'int or "auto"', auto_or(integer()), """\
    Chunks sharing one step (parallel width; the model depends on it, not
    on the number of workers).  "auto" is one per worker thread; stored as
    ``lanes_`` (pass it back to reproduce the fit on another cluster).""", "sgd")
PRECONDITIONER = Param("preconditioner", "eigenpro", '{"eigenpro", None}',
                       one_of(None, "eigenpro"), """\
    "eigenpro": every step updates the whole pool through EigenPro's
    preconditioner, the top eigenpairs of the pool's feature covariance
    on a 4000-row sample (q_ of them, so that the critical batch reaches
    ``batch_size``).  None: Dai et al.'s Alg. 1 as printed, one block of
    B features per step.""", "sgd")

# early stopping ----------------------------------------------------------------------
EARLY_STOPPING = Param("early_stopping", False, "bool", boolean(), """\
    Hold out ``validation_fraction`` of the rows, score the model on them
    after each epoch (accuracy, or R^2 for regression), stop after
    ``n_iter_no_change`` epochs without improvement and keep the best
    epoch's model.""", "early stopping")
VALIDATION_FRACTION = Param("validation_fraction", 0.1, "float",
                            number(0.0, 1.0, high_open=True),
                            "Rows held out by ``early_stopping``: drawn from all rows in "
                            "memory, from each chunk of a store or dask array.",
                            "early stopping")
N_ITER_NO_CHANGE = Param("n_iter_no_change", 2, "int", integer(),
                         "Epochs without improvement before ``early_stopping`` stops.",
                         "early stopping")

# runtime -------------------------------------------------------------------------------
def _seed(text: str) -> int | None:
    """A seed on the command line: an integer, or "none" for a fresh one."""
    return None if text.lower() == "none" else int(text)


RANDOM_STATE = Param("random_state", 0, "int, RandomState, Generator or None",
                     custom(lambda _, v: check_random_state_param(v), _seed), """\
    Global seed of features and shuffling; anything but an int is turned
    into one integer seed at fit (on the command line, "none" draws one),
    stored as ``random_state_``.""", "runtime", aliases=("--seed",))
CLIENT = Param("client", None, "distributed.Client, optional", anything(),
               "Cluster to run on; None means the current client or a new LocalCluster.",
               "runtime", flag=None)
VERBOSE = Param("verbose", False, "bool", boolean(), "Progress line on stderr.", "runtime",
                flag=None)
CHECKPOINT = Param("checkpoint", None, "str, optional", anything(), """\
    Checkpoint file written every ``checkpoint_every`` steps; with
    ``resume=True`` a fit continues from it and ends with the same model.""", "runtime",
                   flag=None)
CHECKPOINT_EVERY = Param("checkpoint_every", 0, "int", integer(0),
                         "Steps between two checkpoints (0: none; a resumed fit keeps its\n"
                         "    checkpoint's).", "runtime", flag=None)
RESUME = Param("resume", False, "bool", boolean(),
               "Continue from ``checkpoint`` (same seed, data and settings: other data or\n"
               "    settings are refused by name).", "runtime",
               flag=None)

_RUNTIME = (RANDOM_STATE, CLIENT, VERBOSE, CHECKPOINT, CHECKPOINT_EVERY, RESUME)
_EARLY = (EARLY_STOPPING, VALIDATION_FRACTION, N_ITER_NO_CHANGE)


def _auto(p: Param, kind: str | None = None, **changes: Any) -> Param:
    """EigenPro's automatic settings: "auto" (None accepted, as before)."""
    return p.but(default=AUTO, kind=kind or p.kind.replace(' or "auto"', "") + ' or "auto"',
                 check=auto_or(p.check, none=True), **changes)


# DSG ---------------------------------------------------------------------------------
LOSS = Param("loss", None, "str, optional", none_or(custom(lambda _, v: None, str)),
             'Loss; None is the task\'s default: "softmax" for the classifier (or "hinge", '
             '"squared_hinge", "logistic"), "squared" for the regressor (or "huber", '
             '"epsilon_insensitive", "quantile").', "model")
AVERAGE = Param("average", False, "bool", boolean(), """\
    Return the average of all iterates, (1/t) sum_i f_i, instead of the
    last one, as scikit-learn's ``SGDRegressor(average=True)``; Dai et
    al.'s O(1/t) figure (Fig. 4(2)) is of this average.  It costs
    O(coefficients changed) a step: one block without the
    preconditioner, all D with it.""")
_DSG_LOCAL_STEPS = Param("local_steps", AUTO, 'int or "auto"', auto_or(integer()), """\
    Preconditioned steps each lane takes on its own rows between two
    averages of the lanes' coefficients (local SGD; a round is one
    engine step, so a round trip and its ``lanes`` tasks serve k steps).
    1: every step is synchronous over the whole batch.  With k > 1 a
    lane's local step has ceil(batch_size / lanes) rows, and q and the
    step size are chosen for that many rows.  "auto": 1 up to 16 lanes,
    else ceil(lanes / 16) (a round's fixed cost grows ~2.5 ms a lane,
    docs/scaling.md), at most what leaves 8 rounds an epoch.  Needs the
    preconditioner.  Stored as ``local_steps_``.""", "sgd")
_DSG_STEP_SIZE = STEP_SIZE.but(
    kind='float, list of float or "auto"', check=auto_or(numbers_or_number()),
    doc=STEP_SIZE.doc + """
    A list, one step per output (a fitted ``step_size_``), is taken as it is.""")
_DSG = (KERNEL, BANDWIDTH, N_FEATURES, BLOCK_SIZE, LOSS, ALPHA, BATCH_SIZE, N_EPOCHS,
        _DSG_STEP_SIZE, STEP_DECAY, PRECONDITIONER, LANES, *_RUNTIME, *_EARLY, AVERAGE,
        FEATURE_CACHE, _DSG_LOCAL_STEPS)
_DSG_REGRESSOR = (
    Param("epsilon", 0.1, "float", number(0.0, low_open=False), """\
        Threshold of the "huber" loss (quadratic within epsilon of the target,
        linear beyond) and half-width of the "epsilon_insensitive" tube, as in
        scikit-learn's ``SGDRegressor``.  Another loss refuses a value other
        than the default (it would be ignored)."""),
    Param("quantile", 0.5, "float",
          number(0.0, 1.0, high_open=True, shown="strictly between 0 and 1"), """\
        Level tau in (0, 1) of the "quantile" (pinball) loss, as in
        scikit-learn's ``QuantileRegressor``: the fit estimates the tau-quantile
        of y given x.  Another loss refuses a value other than the default
        (it would be ignored)."""),
    Param("posterior_variance", False, "bool", boolean(), """\
        Also fit the Gaussian-process posterior variance (Dai et al. App. D),
        for ``predict(X, return_std=True)``: one more pass and a
        n_features x n_features eigendecomposition (n_features <= 8192).
        The prior's amplitude is estimated from y (``gp_amplitude_``), so the
        std is in y's units.  Squared loss only (the GP mean)."""))

# EigenPro ------------------------------------------------------------------------------
_EIGENPRO = (
    KERNEL, BANDWIDTH,
    _auto(Param("n_centers", AUTO, "int", integer(), "", "pool", aliases=("--centers",)), doc="""\
        p kernel centers.  "auto": every row when n <= 100 000, else 20 000
        sampled rows (the all-rows solve factorises a p x p matrix on the
        client, O(p^3)).  Fewer centers than rows never drops rows: every row
        is fitted through the Nystrom objective."""),
    _auto(N_FEATURES, doc="""\
        D random features: a number selects the random-feature form
        (EigenPro-RF); "auto" the kernel form."""),
    _auto(ALPHA.but(check=number()), doc="""\
        Ridge penalty, the same on every route: min (1/n) |K a - y|^2 +
        alpha a^T K a (Rudi et al. eq. 8; K_nM and K_MM with fewer centers than
        rows, |theta|^2 for the random-feature form), whose every-row-a-center
        solution is scikit-learn's ``KernelRidge(alpha=n * alpha)``.  The SGD
        routes' step and critical batch count alpha's curvature (beta + alpha,
        lambda' + alpha).  "auto": 1e-6 in the all-rows solve, 0 on the SGD
        routes (they interpolate; ``n_epochs`` regularises them)."""),
    _auto(Param("q", AUTO, "int", integer(), "", "sgd"), doc="""\
        Eigen-directions flattened; "auto": the largest q whose critical batch
        m* = beta / lambda' + 1 is at most ``max_batch``."""),
    _auto(Param("subsample_size", AUTO, "int", integer(), "", "sgd"), doc="""\
        s rows for the preconditioner.  "auto": kernel form 4096 (the most
        with exact eigenpairs) if n < 1e5 else 12000; random features
        max(8000, 6 n_features) up to 4096 features, else 8000.
        Recorded as ``subsample_size_``."""),
    _auto(Param("damping", AUTO, "float", number(0.0, 1.0), "", "sgd"), doc="""\
        Kernel form: exponent alpha of (lambda_{q+1} / lambda_i) ("auto": 0.95);
        random features: tau of Table 1 ("auto": 0.25).  Recorded as
        ``damping_``."""),
    _auto(BATCH_SIZE, doc="""\
        Rows per step m; "auto": min(m*, max_batch) (docs/design.md §2.4)."""),
    _auto(STEP_SIZE, doc='Step eta; "auto": from m and the eigenvalues (docs/design.md §2.4).'),
    _auto(Param("max_batch", AUTO, "int", integer(), "", "sgd"), doc="""\
        Cap on the automatic batch size ("auto": s for the kernel form, the
        cluster's step width for features)."""),
    N_EPOCHS.but(default=10, doc="""\
        Passes over the data: SGD epochs, or conjugate-gradient iterations of
        the all-rows solve."""),
    BLOCK_SIZE.but(default=1024, doc="Features per seeded block (random-feature form)."),
    Param("kernel_cache", AUTO, '{"auto", "float32", "fixed16", "bfloat16", "off"}',
          one_of(AUTO, "float32", "fixed16", "bfloat16", "off"), """\
        Keep the kernel rows K(X_c, C) on the workers: "auto" picks float32 when
        every worker's share fits its cache budget, else fixed16 (k in [0, 1]
        as round(65535 k): absolute error <= 2^-17) if that fits, else
        recomputes rows each step ("off").  "bfloat16" (relative error 2^-9)
        stays selectable; on Fashion-MNIST its rounding raised the training
        loss after epoch 7 (0.080 -> 0.093; fixed16 falls to 0.033) and cost
        0.4 points of test accuracy.""", "sgd"),
    *_EARLY, LANES, *_RUNTIME,
    FEATURE_CACHE.but(doc=FEATURE_CACHE.doc.replace(
        "Stored as", "The random-feature form only (``n_features`` set).  Stored as")),
    _DSG_LOCAL_STEPS.but(doc="""\
        Preconditioned steps each lane takes on its own rows between two
        averages of the lanes' coefficients (local SGD; a round is one
        engine step, so a round trip and its ``lanes`` tasks serve k steps).
        The random-feature form only.  1: every step is synchronous over the
        whole batch.  With k > 1 a lane's local step has
        min(m*, max_batch / lanes) rows, q chosen for that many.  "auto": 1
        up to 16 lanes, else ceil(lanes / 16), at most what leaves 8 rounds
        an epoch.  Stored as ``local_steps_``."""))

# KernelPCA, KernelSVD, KernelCCA -----------------------------------------------------
_POWER_BATCH = BATCH_SIZE.but(doc="""\
    Rows per step, spread over ``lanes`` chunks.  "auto": 512 for block
    steps; for power steps ``lanes`` x the rows whose features (D, both
    views' 2 D for KernelSVD) are 2^27 feature evaluations (32768 at
    D = 4096 for one view), at most n / 8 (8 steps an epoch) unless that
    is under 16 rows a component, the least power steps accept.  A lane
    takes at most its chunk's rows a step, so chunks shorter than
    ``batch_size / lanes`` make shorter steps; a step shorter than a full
    one (a chunk's last rows) weighs in by its rows.  Stored as
    ``batch_size_``.""")
_BLOCK_STEP_SIZE = STEP_SIZE.but(doc="""\
    theta_0 of eta_t = theta_0 / (1 + theta_1 t), block steps only; "auto" is
    c / lambda_1, lambda_1 the top eigenvalue of the kernel operator on a
    1000-row sample, or of the random features' Gram where that is larger
    (c = 1 for KPCA / KSVD, 0.5 for KCCA), stored as
    ``step_size_``.""")
_BLOCK_STEP_DECAY = STEP_DECAY.but(default=AUTO, kind='float or "auto"',
                                   check=auto_or(STEP_DECAY.check), doc="""\
    theta_1, block steps only; "auto" is 1e-3 (Xie et al.'s setting) for
    block steps and 1e-2 for KernelCCA's preconditioned whole-pool steps,
    which cover the pool every step instead of once per pool cycle; stored
    as ``step_decay_``.""")
CENTER = Param("center", True, "bool", boolean(), """\
    Centre the features by a streaming mean (scikit-learn's convention);
    False solves the uncentred problem of the paper.""")
_POWER_LANES = LANES.but(doc="""\
    Chunks sharing one step (the model depends on it, not on the workers).
    "auto": 4 for block steps, one per worker thread for power steps.
    Stored as ``lanes_``.""")
STEPS = Param("steps", AUTO, '{"auto", "exact", "power", "block"}',
              one_of(AUTO, "block", "power", "exact"), """\
    How the pool is fitted; "block": Xie et al.'s algorithm, one block of
    ``block_size`` features per step on ``batch_size`` rows.  "power": every
    step is a power step on the whole pool over a wide batch (the noisy
    power method, module docstring of :mod:`dkernel.solvers.components`),
    which has no step size: a block step's fixed cost dominates its compute
    on a cluster (docs/scaling.md).  "exact": the solution on the pool over
    all rows, by subspace iteration with 20 extra directions, a dozen
    passes over the rows (no epochs, batches or checkpoints).  "auto":
    "exact" below 16384 rows when no iterative setting (n_epochs,
    batch_size, lanes, checkpoint, checkpoint_every, resume, or a
    feature_cache that keeps features) differs from its default, since a power step converges
    to its own batch's subspace and on few rows a batch is a few hundred
    rows (power steps on 300 rows missed exact kernel PCA by sin^2 0.13);
    else power steps, unless a setting only block steps have is given
    (step_size, step_decay; KernelPCA's ordering="gha"), which selects
    block steps.  Stored as ``steps_``.""")
_POOL = (N_FEATURES.but(doc="""\
             Size D of the pool of random features (per view); after
             D / block_size steps existing seeds are revisited (Xie et al. 4.2)."""),
         BLOCK_SIZE)
_ITERATIVE = (_POWER_BATCH, N_EPOCHS, _BLOCK_STEP_SIZE, _BLOCK_STEP_DECAY, CENTER)
_KERNEL_PCA = (
    N_COMPONENTS.but(default=8), KERNEL, BANDWIDTH, *_POOL, *_ITERATIVE,
    Param("ordering", "rotate", '{"rotate", "gha"}', one_of("rotate", "gha"), """\
        Block steps only; "rotate": Oja subspace update, then a Rayleigh-Ritz
        rotation; "gha": Xie eq. (16), the upper-triangular update that isolates
        the individual eigenfunctions (the rotation is still applied at the end)."""),
    STEPS, _POWER_LANES, *_RUNTIME, FEATURE_CACHE)
_KERNEL_SVD = (N_COMPONENTS, KERNEL, BANDWIDTH, KERNEL_Y, BANDWIDTH_Y, *_POOL, *_ITERATIVE,
               STEPS, _POWER_LANES, *_RUNTIME, FEATURE_CACHE)
_KERNEL_CCA = (
    N_COMPONENTS, KERNEL, BANDWIDTH, KERNEL_Y, BANDWIDTH_Y,
    ALPHA.but(default=1e-3, doc="""\
        Regularisation kappa: covariances C_XX + kappa I (in units of the
        kernel operator's eigenvalues)."""),
    Param("init", "subsample", '{"subsample", "random"}', one_of("subsample", "random"), """\
        Start of the iteration.  "subsample": exact regularised CCA on
        ``init_rows`` sampled rows and the pool's first 2048 features (one
        small dense solve on the client), refined by the stochastic steps
        over all rows and the whole pool; "random": a random orthonormal
        subspace (Xie et al. need only a non-zero start)."""),
    Param("init_rows", 8000, "int", integer(),
          'Rows sampled for the "subsample" start and the preconditioner (unused '
          'without either, as a grid over init may set it for every candidate).'),
    PRECONDITIONER.but(doc="""\
        "eigenpro": every step updates the whole pool through EigenPro's
        preconditioner (top-q eigenpairs of each view's centred feature
        covariance on the ``init_rows`` sample, q set by ``batch_size``),
        which lets the step grow by lambda_1 / lambda_{q+1} (the automatic
        step is 0.5 / max(lambda_{q+1}, alpha): the ridge term is not
        flattened); workers return
        a D x 2k block per task and view (fewer ``lanes`` send fewer).
        None: Xie's Alg. 4 as printed, one feature block per step.  Both
        have the same fixed point; on Fashion-MNIST halves (k = 50) "eigenpro"
        reached a held-out correlation sum of 45.24 with 16384 features in 2
        epochs (69 s), Alg. 4 as printed 43.75 with 4096 features in 10
        epochs (199 s) (module docstring of :mod:`dkernel.solvers.components`;
        ``benchmarks/fashion_kcca.py``)."""),
    *_POOL, BATCH_SIZE.but(default=512, kind="int", check=integer(),
                           doc="Rows per step, spread over ``lanes`` chunks."),
    N_EPOCHS, _BLOCK_STEP_SIZE.but(doc=_BLOCK_STEP_SIZE.doc.replace(", block steps only", "")),
    _BLOCK_STEP_DECAY.but(doc=_BLOCK_STEP_DECAY.doc.replace(", block steps only", "")), CENTER,
    LANES.but(default=4, kind="int", check=integer(),
              doc="Chunks sharing one step (the model depends on it, not on the workers)."),
    *_RUNTIME, FEATURE_CACHE)

# StreamingKernelPCA --------------------------------------------------------------------
_STREAMING = (
    N_COMPONENTS.but(default=1), KERNEL, BANDWIDTH,
    N_FEATURES.but(default=2048, doc="D, the width of the fixed feature map z (z.z ~ k)."),
    STEP_SIZE.but(doc="""\
        Constant eta.  "auto" follows Deng et al.'s theorem regime,
        eta = 2 log D / (n lambda_k): n the number of rows (known before the
        pass), lambda_k the k-th eigenvalue of the (centred) feature covariance
        of a 1000-row sample (lambda_1 for one component, as in the paper), so
        that the k-th direction grows by D^2 over the pass whatever n and the
        stream noise falls with n; capped at their condition
        eta <= 0.1 / max|z|^2.  Resolved value: ``eta_``."""),
    CENTER.but(doc="""\
        Subtract the running mean of the features (exactly, inside the blocked
        update); False is the paper's uncentred covariance."""),
    Param("block_rows", 512, "int", integer(),
          "Rows per exact triangular block (memory b^2 per block).", "sgd"),
    Param("n_passes", AUTO, 'int or "auto"', auto_or(integer()), """\
        Passes over the rows, in the same order, as one stream of
        ``n_passes`` x n rows (the step and the Rayleigh quotients' second
        half count the whole stream).  "auto": one pass when there are at
        least 16384 rows, else enough passes to stream that many, at most
        16: one pass over 300 rows missed exact kernel PCA by sin^2 0.56, as
        the stream noise of Oja's rule falls with the rows it sees
        (benchmarks/quality.py).  With ``step_size="auto"`` too, under 1024
        rows (16 passes short of 16384) the components are solved exactly
        from every row's features instead (``n_passes_`` 0), unless a
        setting only the stream uses is given (``block_rows``, a
        checkpoint).  Resolved value: ``n_passes_``.""", "sgd"),
    *_RUNTIME)

# DSGOneClassSVM, DSGDensityRatio -------------------------------------------------------
_WHOLE_POOL = (
    KERNEL, BANDWIDTH,
    N_FEATURES.but(default=2048, doc="Size D of the random feature pool; f = z^T w with z.z ~ k."),
    BLOCK_SIZE.but(doc="Features per seed (block) of the pool."),
    BATCH_SIZE.but(doc="""\
        Rows per step, spread over ``lanes`` chunks: each lane's local step
        takes ceil(batch_size / lanes) of its rows.  "auto": 256 a lane, at
        least 512 (a local step of a few rows is Python overhead, not compute).
        Stored as ``batch_size_``."""),
    N_EPOCHS, STEP_SIZE,
    STEP_DECAY.but(default=AUTO, kind='float or "auto"', check=auto_or(STEP_DECAY.check), doc="""\
        gamma_t = step_size / (1 + step_decay * t).  "auto" is nu * step_size
        (nu the strong convexity, ``nu`` or ``alpha``), so that gamma_t tends
        to 1 / (nu t), the rate-optimal schedule of Pegasos and of Dai et
        al.'s theorems, without their huge first steps.  The model is the
        polynomial-decay average of the iterates (Shamir & Zhang 2013)."""),
    LANES.but(doc=LANES.doc.replace("one step", "one round")),
    Param("local_steps", AUTO, 'int or "auto"', auto_or(integer()), """\
        Steps each lane takes on its own rows between two averages of the
        lanes' iterates (a round, one engine step: local SGD).  1 is the
        synchronous step on the whole batch.  "auto": a lane's round is about
        2^27 feature evaluations (65536 rows at n_features=2048, 128 local
        steps of 512 rows), so its compute dwarfs the round trip, but at least
        8 rounds an epoch.  Stored as ``local_steps_``.""", "sgd"),
    *_RUNTIME, FEATURE_CACHE)

# the CLI reads 0 (or "none") as None: no truncation schedule
_THETA = dataclasses.replace(none_or(number(0.0, 1.0)),
                             parse=lambda t: None if t == "none" or float(t) == 0 else float(t))

# SphereRegressor -------------------------------------------------------------------------
_SPHERE = (
    Param("s", 1.0, "float", number(), "Smoothness of the kernel: mu_k = (dim Pi_k)^(-2 s).",
          flag="--smoothness"),
    Param("theta", 1 / 3, "float in (0, 1] or None", _THETA, """\
        Truncation level parameter; 1 / (1 + 2 s) balances bias and variance
        (Theorem 1).  None (CLI: 0): no schedule, L_n = max_degree at every
        step, i.e. plain kernel SGD with the kernel K^{max_degree}."""),
    Param("eta0", 0.5, "float", number(), "Initial step; needs eta0 * K^L(x, x) < 2."),
    Param("t", 0.0, "float", number(0.0, low_open=False),
          "Step decay: eta_n = eta0 * n^-t (0: constant step, the paper's headline).",
          flag="--step-exponent"),
    Param("max_degree", None, "int, optional", none_or(integer(0)),
          "Cap on the truncation level (None: none)."),
    Param("input_map", "normalize", '{"normalize", "stereographic"}',
          one_of("normalize", "stereographic"), """\
        How rows reach the sphere: x / |x|, or the inverse stereographic
        projection of x / scale onto S^p (one-to-one; for data that is not
        spherical, adds one coordinate)."""),
    Param("scale", 1.0, "float", number(), "Scale of the stereographic map."),
    Param("form", AUTO, '{"auto", "features", "kernel"}', one_of(AUTO, "features", "kernel"), """\
        Representation of f: coefficients on a basis of Pi_L (spherical
        harmonics for d = 2, 3, monomials for low degree otherwise) or the
        kernel expansion over the training points; "auto" picks the cheaper."""),
    BLOCK_SIZE.but(doc="Rows per exact blocked update (triangular solve of this size)."),
    N_EPOCHS.but(default=1, doc="Passes over the data; the step counter n continues across "
                 "passes."),
    Param("record_at", None, "sequence of int, optional", none_or(int_sequence()), """\
        Step counts n at which the averaged model is kept, for learning
        curves (:meth:`staged_predict`); each in 1..n_rows * n_epochs.""",
          flag=None),
    *_RUNTIME[1:])


def _with(params: tuple, **changes: dict) -> tuple[Param, ...]:
    return tuple(p.but(**changes[p.name]) if p.name in changes else p for p in params)


_NU = Param("nu", 0.5, "float in (0, 1]", number(0.0, 1.0), """\
    Upper bound on the fraction of training outliers and lower bound on the
    fraction of support vectors; also the regularisation strength.""")

#: Each estimator's parameters, in signature order, as it declares them.
ESTIMATORS: dict[str, tuple[Param, ...]] = {
    "DSGClassifier": _DSG,
    "DSGRegressor": _DSG + _DSG_REGRESSOR,
    "EigenProClassifier": _EIGENPRO,
    "EigenProRegressor": _EIGENPRO,
    "KernelPCA": _KERNEL_PCA,
    "KernelSVD": _KERNEL_SVD,
    "KernelCCA": _KERNEL_CCA,
    "StreamingKernelPCA": _STREAMING,
    "DSGOneClassSVM": (_NU, *_with(_WHOLE_POOL, step_size={"doc": """\
        gamma_0; "auto" is 1 (f and the offset live on the scale of
        k(x, x) = 1).  With ``step_decay="auto"`` gamma_t = 1 / (1 + nu t)."""})),
    "DSGDensityRatio": (ALPHA.but(default=1e-3, check=number(),
                                  doc="Regularisation strength nu of |f|^2."),
                        *_with(_WHOLE_POOL, step_size={"doc": """\
        gamma_0; "auto" is n_q / (n lambda_1): the inverse curvature of the exp
        term at the start (weight n / n_q, f = 0) times the top eigenvalue
        lambda_1 of the kernel operator on a 1000-row sample (of the random
        features' Gram where that is larger: a narrow bandwidth)."""})),
    "SphereRegressor": _SPHERE,
}


def params_of(estimator: type | str) -> tuple[Param, ...]:
    """The declared parameters of an estimator class (or its name; subclasses
    of a public estimator get its parameters)."""
    if isinstance(estimator, str):
        return ESTIMATORS[estimator]
    for cls in estimator.__mro__:
        if cls.__name__ in ESTIMATORS:
            return ESTIMATORS[cls.__name__]
    raise KeyError(f"{estimator.__name__} has no parameter spec")


def documented(cls: type) -> type:
    """Class decorator: the docstring's Parameters section, from the spec."""
    from dkernel.estimators.params import with_parameters

    cls.__doc__ = with_parameters(cls.__doc__ or "", params_of(cls))
    return cls


#: What an "auto" default is resolved from at fit time (``dkernel fit --help``).
AUTO_FROM = {
    "bandwidth": "the median heuristic on a sample of rows",
    "batch_size": "the lanes and the pool width (the estimator's docstring)",
    "step_size": "the top eigenvalue of a sample",
    "step_decay": "the kind of step, or nu * step_size",
    "lanes": "one per worker thread",
    "n_centers": "every row up to 100000, else 20000 centers",
    "n_features": "the kernel form",
    "alpha": "1e-6 in the all-rows solve, else 0",
    "q": "the largest q whose critical batch fits max_batch",
    "subsample_size": "the route and the row count",
    "damping": "0.95 (kernel form), 0.25 (features)",
    "max_batch": "the subsample or the cluster's step width",
    "kernel_cache": "the workers' memory",
    "feature_cache": "the workers' memory and the epochs",
    "steps": "the row count and the other settings",
    "n_passes": "the row count (16384 rows streamed)",
    "local_steps": "the lanes, the pool width and the rows",
    "form": "the cheaper representation",
}
