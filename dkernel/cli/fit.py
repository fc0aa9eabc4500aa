"""``dkernel fit STORE --solver S --out MODEL``: train and save a model."""

from __future__ import annotations

import argparse
import os
import time
from collections.abc import Callable
from typing import Any

from dkernel.cli.common import (
    add_cluster_args,
    add_command,
    add_output_args,
    bandwidth_arg,
    check_output,
    cluster_options,
    emit,
    status,
)
from dkernel.kernels.exact import KERNELS


def _given(
    args: argparse.Namespace, kw: dict[str, Any], pairs: tuple[tuple[str, str], ...]
) -> dict:
    """Copy the options the user gave (not None) into the estimator's keywords."""
    for flag, param in pairs:
        value = getattr(args, flag, None)
        if value is not None:
            kw[param] = value
    return kw


#: flag dest -> estimator parameter, for the options most solvers share
_COMMON = (("kernel", "kernel"), ("bandwidth", "bandwidth"), ("seed", "random_state"))
_EARLY_STOPPING = (
    ("early_stopping", "early_stopping"),
    ("validation_fraction", "validation_fraction"),
    ("n_iter_no_change", "n_iter_no_change"),
)


def _task(args: argparse.Namespace) -> str:
    return args.task or "classification"


def _given_early_stopping(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    """The early-stopping options, refused without --early-stopping (which alone uses them)."""
    if not getattr(args, "early_stopping", None):
        for flag in ("validation_fraction", "n_iter_no_change"):
            if getattr(args, flag, None) is not None:
                raise ValueError(f"--{flag.replace('_', '-')} applies with --early-stopping; add "
                                 "--early-stopping or drop it")
    return _EARLY_STOPPING


def _build_dsg(args: argparse.Namespace) -> Any:
    from dkernel import DSGClassifier, DSGRegressor

    cls = DSGClassifier if _task(args) == "classification" else DSGRegressor
    kw: dict[str, Any] = {}
    from dkernel.losses import LOSS_PARAMS

    for flag in ("epsilon", "quantile"):
        if getattr(args, flag, None) is not None and cls is DSGClassifier:
            raise ValueError(f"--{flag} is a parameter of the regression losses; "
                             "use it with --task regression")
        loss = args.loss or cls._default_loss
        if getattr(args, flag, None) is not None and flag not in LOSS_PARAMS.get(loss, {}):
            takers = " or ".join(k for k, v in LOSS_PARAMS.items() if flag in v)
            raise ValueError(f"--{flag} applies to --loss {takers}, and the loss is {loss}; "
                             f"add --loss {takers.split(' or ')[0]} or drop --{flag}")
    if args.preconditioner is not None:
        kw["preconditioner"] = None if args.preconditioner == "none" else args.preconditioner
    return cls(
        **_given(
            args,
            kw,
            _COMMON
            + _given_early_stopping(args)
            + (
                ("features", "n_features"),
                ("epochs", "n_epochs"),
                ("batch_size", "batch_size"),
                ("alpha", "alpha"),
                ("loss", "loss"),
                ("average", "average"),
                ("block_size", "block_size"),
                ("step_size", "step_size"),
                ("step_decay", "step_decay"),
                ("lanes", "lanes"),
                ("epsilon", "epsilon"),
                ("quantile", "quantile"),
            ),
        )
    )


def _build_sphere(args: argparse.Namespace) -> Any:
    from dkernel import SphereRegressor

    if args.task == "classification":
        raise ValueError(
            "--solver sphere fits regression only (SphereRegressor); drop "
            "--task classification, or use --solver dsg or eigenpro to classify"
        )
    kw = _given(
        args,
        {},
        (
            ("sphere_s", "s"),
            ("theta", "theta"),
            ("eta0", "eta0"),
            ("step_exponent", "t"),
            ("max_degree", "max_degree"),
            ("input_map", "input_map"),
            ("scale", "scale"),
            ("form", "form"),
            ("block_size", "block_size"),
            ("epochs", "n_epochs"),
        ),
    )
    if getattr(args, "theta", None) is not None and args.theta <= 0:
        kw["theta"] = None  # --theta 0: plain kernel SGD at level --max-degree
    return SphereRegressor(**kw)


def _build_eigenpro(args: argparse.Namespace) -> Any:
    """Kernel form by default (all rows, or ``--centers P``); ``--features D`` for EigenPro-RF."""
    from dkernel import EigenProClassifier, EigenProRegressor

    cls = EigenProClassifier if _task(args) == "classification" else EigenProRegressor
    return cls(
        **_given(
            args,
            {},
            _COMMON
            + _given_early_stopping(args)
            + (
                ("centers", "n_centers"),
                ("features", "n_features"),
                ("epochs", "n_epochs"),
                ("alpha", "alpha"),  # ridge of the all-rows solve (--centers below n)
                ("batch_size", "batch_size"),
                ("step_size", "step_size"),
                ("block_size", "block_size"),
                ("lanes", "lanes"),
            ),
        )
    )


def _build_components(args: argparse.Namespace) -> Any:
    """``--solver kpca`` (KernelPCA), ``oja`` (StreamingKernelPCA), ``kcca`` /
    ``ksvd`` (KernelCCA / KernelSVD: the store's ``y`` is the second view, which
    ``--y-view`` must confirm: the y of a labelled store is not a view)."""
    from dkernel import KernelCCA, KernelPCA, KernelSVD, StreamingKernelPCA

    cls = {"kpca": KernelPCA, "kcca": KernelCCA, "ksvd": KernelSVD, "oja": StreamingKernelPCA}[
        args.solver
    ]
    if cls in (KernelCCA, KernelSVD) and not args.y_view:
        raise ValueError(
            f"--solver {args.solver} needs two views with the same rows: a store whose "
            "y array holds the second view (n x d_y), confirmed by --y-view; the y of a "
            "labelled store is a label, not a view"
        )
    kw: dict[str, Any] = _given(
        args,
        {},
        _COMMON
        + (("components", "n_components"), ("features", "n_features"), ("step_size", "step_size")),
    )
    if cls is not StreamingKernelPCA:
        _given(
            args,
            kw,
            (
                ("epochs", "n_epochs"),
                ("batch_size", "batch_size"),
                ("block_size", "block_size"),
                ("step_decay", "step_decay"),
                ("lanes", "lanes"),
            ),
        )
    if cls in (KernelPCA, KernelSVD):
        _given(args, kw, (("steps", "steps"),))
    if cls is KernelCCA:
        _given(args, kw, (("alpha", "alpha"),))
        if args.preconditioner is not None:
            kw["preconditioner"] = None if args.preconditioner == "none" else args.preconditioner
    return cls(**kw)


class _Reads:
    """``args`` as a builder sees it, noting which options it read."""

    def __init__(self, args: argparse.Namespace) -> None:
        self._args, self.read = args, set()

    def __getattr__(self, name: str) -> Any:
        self.read.add(name)
        return getattr(self._args, name)


def build(args: argparse.Namespace) -> Any:
    """The unfitted estimator of ``--solver``; a solver option (the parser's
    "solver options" group) the solver's builder does not read is an error,
    not silently ignored."""
    seen = _Reads(args)
    est = SOLVERS[args.solver](seen)
    unused = [
        flag
        for dest, flag in args.solver_options.items()
        if getattr(args, dest, None) is not None and dest not in seen.read
    ]
    if unused:
        raise ValueError(
            f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply "
            f"to --solver {args.solver}; drop {'it' if len(unused) == 1 else 'them'}"
        )
    return est


#: solver name -> builder(args) returning an unfitted estimator.
SOLVERS: dict[str, Callable[[argparse.Namespace], Any]] = {"dsg": _build_dsg}
SOLVERS["sphere"] = _build_sphere
SOLVERS["kpca"] = SOLVERS["kcca"] = SOLVERS["ksvd"] = SOLVERS["oja"] = _build_components
SOLVERS["eigenpro"] = _build_eigenpro


def register(sub: argparse._SubParsersAction) -> None:
    p = add_command(
        sub,
        "fit",
        "train a model on a dataset store",
        "Train a model on a zarr dataset store and save it (written atomically: "
        "a failed fit leaves no model file).",
    )
    p.add_argument("store", help="dataset store: a zarr group with X (and y), local or s3:// etc.")
    p.add_argument("--out", required=True, metavar="MODEL", help="model file to write (.npz)")
    p.add_argument(
        "--solver",
        default="dsg",
        help="algorithm: dsg (doubly stochastic gradients), eigenpro, sphere "
        "(truncated kernel SGD on spheres), kpca, kcca, ksvd, oja (streaming kernel PCA)",
    )
    # options some solvers take (default None: the estimator's own default);
    # ``build`` rejects one the chosen solver does not read, so this group is
    # the single list of them
    g = p.add_argument_group(
        "solver options",
        "Each applies to the solvers named in its help; left out, the estimator's own default "
        "applies (see its docstring); given to a solver that does not take it, an error.",
    )
    g.add_argument(
        "--task",
        choices=("classification", "regression"),
        help="dsg, eigenpro (default: classification); sphere: regression only",
    )
    g.add_argument(
        "--kernel", help=f"kernel: {', '.join(KERNELS)} (all but sphere; default: gaussian)"
    )
    g.add_argument(
        "--bandwidth",
        type=bandwidth_arg,
        help="kernel scale, a number or 'auto' (median heuristic; all but sphere; default: auto)",
    )
    g.add_argument(
        "--seed", type=int, help="random_state, the global seed (all but sphere; default: 0)"
    )
    g.add_argument(
        "--features",
        type=int,
        metavar="D",
        help="n_features, random features (dsg, eigenpro: selects its random-feature form; "
        "kpca, kcca, ksvd, oja)",
    )
    g.add_argument(
        "--centers",
        type=int,
        metavar="P",
        help="n_centers, kernel centers sampled from the rows (eigenpro kernel form; "
        "default: all rows up to 100000)",
    )
    g.add_argument(
        "--components", type=int, metavar="K", help="n_components (kpca, kcca, ksvd, oja)"
    )
    g.add_argument(
        "--epochs", type=int, metavar="N", help="n_epochs, passes over the data (all but oja)"
    )
    g.add_argument(
        "--batch-size",
        dest="batch_size",
        type=int,
        metavar="M",
        help="rows per step (dsg, eigenpro, kpca, kcca, ksvd)",
    )
    g.add_argument("--alpha", type=float, help="regularisation strength (dsg, kcca)")
    g.add_argument(
        "--loss",
        help="loss (dsg): squared, huber, epsilon_insensitive, quantile; "
        "softmax, hinge, squared_hinge, logistic",
    )
    g.add_argument(
        "--epsilon",
        type=float,
        help="huber threshold / epsilon_insensitive tube (dsg regression)",
    )
    g.add_argument(
        "--quantile", type=float, help="level of the quantile loss, in (0, 1) (dsg regression)"
    )
    g.add_argument(
        "--block-size",
        dest="block_size",
        type=int,
        help="features per seeded block (dsg, eigenpro, kpca, kcca, ksvd); rows per "
        "exact block (sphere)",
    )
    g.add_argument(
        "--step-size",
        dest="step_size",
        type=bandwidth_arg,
        help="initial step, a number or 'auto' (dsg, eigenpro, kpca, kcca, ksvd, oja)",
    )
    g.add_argument(
        "--step-decay",
        dest="step_decay",
        type=float,
        help="theta_1 of step_size / (1 + theta_1 t) (dsg, kpca, kcca, ksvd)",
    )
    g.add_argument(
        "--lanes",
        type=lambda v: v if v == "auto" else int(v),
        help="chunks that share one step (dsg, eigenpro, kpca, kcca, ksvd); 'auto' (the default "
        "of dsg, eigenpro, kpca and ksvd; kcca takes a number): one per worker thread (4 for "
        "kpca's and ksvd's block steps), recorded in the model",
    )
    g.add_argument(
        "--early-stopping",
        dest="early_stopping",
        action="store_true",
        default=None,
        help="hold out --validation-fraction of the rows, score them after each epoch, "
        "stop after --n-iter-no-change epochs without improvement and keep the best "
        "epoch (dsg, eigenpro)",
    )
    g.add_argument(
        "--validation-fraction",
        dest="validation_fraction",
        type=float,
        help="rows held out by --early-stopping (dsg, eigenpro; default: 0.1)",
    )
    g.add_argument(
        "--n-iter-no-change",
        dest="n_iter_no_change",
        type=int,
        help="epochs without improvement before --early-stopping stops (dsg, eigenpro; default: 2)",
    )
    g.add_argument(
        "--y-view",
        dest="y_view",
        action="store_true",
        default=None,
        help="kcca, ksvd (required): the store's y array is the second view",
    )
    g.add_argument(
        "--average",
        action="store_true",
        default=None,
        help="dsg: keep the average of all iterates, (1/t) sum f_i, as the model "
        "(Dai et al.'s O(1/t) figure is of it; default: the last iterate)",
    )
    g.add_argument(
        "--preconditioner",
        choices=("none", "eigenpro"),
        help="dsg, kcca: 'eigenpro' (preconditioned whole-pool steps; default) or 'none' "
        "(the papers' block steps: Dai et al. Alg. 1, Xie et al. Alg. 4)",
    )
    g.add_argument(
        "--steps",
        choices=("auto", "exact", "block", "power"),
        help="kpca, ksvd: 'exact' (subspace iteration over all rows, a dozen passes), "
        "'power' (whole-pool power steps on wide batches, for data on a cluster), 'block' "
        "(Xie et al.'s Alg. 1-3, one feature block a step) or 'auto' (default: exact below "
        "16384 rows unless --epochs, --batch-size, --lanes or --checkpoint-every is given, "
        "else power, unless --step-size or --step-decay asks for block steps)",
    )
    g.add_argument(
        "--smoothness", dest="sphere_s", type=float, help="s of the zonal kernel (sphere)"
    )
    g.add_argument(
        "--theta", type=float, help="truncation level parameter (sphere); 0: no truncation"
    )
    g.add_argument("--eta0", type=float, help="initial step eta0 (sphere)")
    g.add_argument(
        "--step-exponent", dest="step_exponent", type=float, help="t in eta0 n^-t (sphere)"
    )
    g.add_argument(
        "--max-degree", dest="max_degree", type=int, help="cap on the truncation level (sphere)"
    )
    g.add_argument(
        "--input-map",
        dest="input_map",
        choices=("normalize", "stereographic"),
        help="how rows reach the sphere (sphere)",
    )
    g.add_argument("--scale", type=float, help="scale of the stereographic map (sphere)")
    g.add_argument("--form", choices=("auto", "features", "kernel"), help="representation (sphere)")
    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (default: MODEL.ckpt.npz)")
    c.add_argument(
        "--checkpoint-every",
        dest="checkpoint_every",
        type=int,
        default=0,
        metavar="N",
        help="write a checkpoint every N steps (0: never)",
    )
    c.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    add_output_args(p, overwrite=True)
    add_cluster_args(p)
    p.set_defaults(func=run, solver_options={a.dest: a.option_strings[0] for a in g._group_actions})


def run(args: argparse.Namespace) -> int:
    from dkernel.data import open_dataset
    from dkernel.engine import connect
    from dkernel.io import file_exists, remove_file

    if args.solver not in SOLVERS:
        raise ValueError(
            f"--solver {args.solver!r} is not available; choose one of {', '.join(sorted(SOLVERS))}"
        )
    if os.path.isdir(args.out):
        raise ValueError(
            f"--out {args.out!r} is a folder; give a model file path such as model.npz"
        )
    check_output(args.out, args.overwrite)
    if args.checkpoint and not (args.checkpoint_every or args.resume):
        raise ValueError(
            "--checkpoint names the file of --checkpoint-every N / --resume; "
            "add one of them (alone it would be ignored)"
        )
    est = build(args)
    checkpoint = args.checkpoint or (args.out + ".ckpt.npz")
    if args.checkpoint_every or args.resume:
        est.set_params(
            checkpoint=checkpoint, checkpoint_every=args.checkpoint_every, resume=args.resume
        )
    if not args.resume and file_exists(checkpoint):
        # a rerun without --resume would start over and, once done, delete the
        # checkpoint: the interrupted fit's progress lost without a word
        if not args.overwrite:
            raise FileExistsError(
                f"checkpoint {checkpoint} holds the progress of an unfinished fit; pass "
                "--resume to continue it, or --overwrite to start over (the checkpoint is "
                "deleted)")
        remove_file(checkpoint)
        status(args, f"--overwrite: deleted the checkpoint {checkpoint}; starting over")
    if args.resume:
        # a mistyped path must not pass for a resumed fit: say which it is
        status(args, f"resuming from {checkpoint}" if file_exists(checkpoint) else
               f"--resume: no checkpoint at {checkpoint}; starting from the first step")
    if "verbose" in est.get_params():
        est.set_params(verbose=not args.quiet)
    open_dataset(args.store)  # fail on a missing / malformed store before starting a cluster
    start = time.perf_counter()
    with connect(**cluster_options(args)) as client:
        est.set_params(client=client)
        est.fit(args.store)
    seconds = time.perf_counter() - start
    est.set_params(client=None)
    est.save(args.out)
    remove_file(checkpoint)  # a local path or a URL (s3://...)
    status(args, f"saved {type(est).__name__} to {args.out} ({seconds:.1f} s)")
    if args.json:
        emit(
            args,
            {
                "model": args.out,
                "estimator": type(est).__name__,
                "seconds": seconds,
                "history": getattr(est, "history_", None),
            },
        )
    return 0
