"""``dkernel fit STORE --solver S --out MODEL``: train and save a model."""

from __future__ import annotations

import argparse
import os
import sys
from typing import Any, Callable

from dkernel.cli.common import add_cluster_args, bandwidth_arg


def _build_dsg(args: argparse.Namespace) -> Any:
    from dkernel import DSGClassifier, DSGRegressor

    cls = DSGClassifier if args.task == "classification" else DSGRegressor
    kw = dict(kernel=args.kernel, bandwidth=args.bandwidth, random_state=args.seed)
    for flag, param in (("features", "n_features"), ("epochs", "n_epochs"), ("batch_size", "batch_size"),
                        ("alpha", "alpha"), ("loss", "loss"), ("block_size", "block_size"),
                        ("step_size", "step_size"), ("step_decay", "step_decay"), ("lanes", "lanes")):
        value = getattr(args, flag, None)
        if value is not None:
            kw[param] = value
    return cls(**kw)


def _build_sphere(args: argparse.Namespace) -> Any:
    from dkernel import SphereRegressor

    kw: dict[str, Any] = {}
    for flag, param in (("sphere_s", "s"), ("theta", "theta"), ("eta0", "eta0"), ("step_exponent", "t"),
                        ("max_degree", "max_degree"), ("input_map", "input_map"), ("scale", "scale"),
                        ("form", "form"), ("block_size", "block_size"), ("epochs", "n_epochs")):
        value = getattr(args, flag, None)
        if value is not None:
            kw[param] = value
    if getattr(args, "theta", None) is not None and args.theta <= 0:
        kw["theta"] = None  # --theta 0: plain kernel SGD at level --max-degree
    return SphereRegressor(**kw)


def _build_eigenpro(args: argparse.Namespace) -> Any:
    """Kernel form by default (all rows, or ``--centers P``); ``--features D`` for EigenPro-RF."""
    from dkernel import EigenProClassifier, EigenProRegressor

    cls = EigenProClassifier if args.task == "classification" else EigenProRegressor
    kw: dict[str, Any] = dict(kernel=args.kernel, bandwidth=args.bandwidth, random_state=args.seed)
    for flag, param in (("centers", "n_centers"), ("features", "n_features"), ("epochs", "n_epochs"),
                        ("alpha", "alpha"),  # ridge of the all-rows solve (--centers below n)
                        ("batch_size", "batch_size"), ("step_size", "step_size"),
                        ("block_size", "block_size"), ("lanes", "lanes")):
        value = getattr(args, flag, None)
        if value is not None:
            kw[param] = value
    return cls(**kw)


def _build_components(args: argparse.Namespace) -> Any:
    """``--solver kpca`` (KernelPCA), ``kcca`` (KernelCCA: the store's ``y`` is the
    second view) or ``oja`` (StreamingKernelPCA)."""
    from dkernel import KernelCCA, KernelPCA, StreamingKernelPCA

    cls = {"kpca": KernelPCA, "kcca": KernelCCA, "oja": StreamingKernelPCA}[args.solver]
    kw: dict[str, Any] = dict(kernel=args.kernel, bandwidth=args.bandwidth, random_state=args.seed)
    flags = [("components", "n_components"), ("features", "n_features"), ("step_size", "step_size")]
    if cls is not StreamingKernelPCA:
        flags += [("epochs", "n_epochs"), ("batch_size", "batch_size"),
                  ("block_size", "block_size"), ("step_decay", "step_decay"), ("lanes", "lanes")]
    if cls is KernelCCA:
        flags.append(("alpha", "alpha"))
        if args.preconditioner is not None:
            kw["preconditioner"] = None if args.preconditioner == "none" else args.preconditioner
    for flag, param in flags:
        value = getattr(args, flag, None)
        if value is not None:
            kw[param] = value
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
    unused = [flag for dest, flag in args.solver_options.items()
              if getattr(args, dest, None) is not None and dest not in seen.read]
    if unused:
        raise ValueError(f"{', '.join(unused)} {'does' if len(unused) == 1 else 'do'} not apply "
                         f"to --solver {args.solver}; drop {'it' if len(unused) == 1 else 'them'}")
    return est


#: solver name -> builder(args) returning an unfitted estimator.
SOLVERS: dict[str, Callable[[argparse.Namespace], Any]] = {"dsg": _build_dsg}
SOLVERS["sphere"] = _build_sphere
SOLVERS["kpca"] = SOLVERS["kcca"] = SOLVERS["oja"] = _build_components
SOLVERS["eigenpro"] = _build_eigenpro


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("fit", help="train a model on a dataset store",
                       description="Train a model on a zarr dataset store and save it (atomically).")
    p.add_argument("store", help="dataset store (zarr group with X and y)")
    p.add_argument("--solver", default="dsg", help=f"algorithm: {', '.join(sorted(SOLVERS))}")
    p.add_argument("--task", choices=("classification", "regression"), default="classification")
    p.add_argument("--kernel", default="gaussian", help="gaussian, laplacian or cauchy")
    p.add_argument("--bandwidth", type=bandwidth_arg, default="auto", help="number or 'auto'")
    # options some solvers take (default None); ``build`` rejects one the chosen
    # solver does not read, so the group is the single list of them
    g = p.add_argument_group("solver options")
    g.add_argument("--features", type=int, help="n_features: random features D")
    g.add_argument("--centers", type=int, help="n_centers: kernel centers p (EigenPro kernel form)")
    g.add_argument("--components", type=int, help="n_components k (kpca, kcca, oja)")
    g.add_argument("--epochs", type=int, help="n_epochs")
    g.add_argument("--batch-size", dest="batch_size", type=int)
    g.add_argument("--alpha", type=float, help="regularisation strength")
    g.add_argument("--loss", help="loss (dsg): squared, hinge, logistic, softmax, ...")
    g.add_argument("--block-size", dest="block_size", type=int, help="features per block (dsg)")
    g.add_argument("--step-size", dest="step_size", type=bandwidth_arg,
                   help="initial step, a number or 'auto' (dsg)")
    g.add_argument("--step-decay", dest="step_decay", type=float)
    g.add_argument("--lanes", type=int, help="chunks that share one step")
    g.add_argument("--preconditioner", choices=("none", "eigenpro"),
                   help="kcca: 'eigenpro' (preconditioned whole-pool steps) or 'none' (Xie Alg. 4)")
    g.add_argument("--smoothness", dest="sphere_s", type=float, help="s of the zonal kernel (sphere)")
    g.add_argument("--theta", type=float, help="truncation level parameter (sphere); 0: no truncation")
    g.add_argument("--eta0", type=float, help="initial step eta0 (sphere)")
    g.add_argument("--step-exponent", dest="step_exponent", type=float, help="t in eta0 n^-t (sphere)")
    g.add_argument("--max-degree", dest="max_degree", type=int, help="cap on the truncation level (sphere)")
    g.add_argument("--input-map", dest="input_map", choices=("normalize", "stereographic"),
                   help="how rows reach the sphere (sphere)")
    g.add_argument("--scale", type=float, help="scale of the stereographic map (sphere)")
    g.add_argument("--form", choices=("auto", "features", "kernel"), help="representation (sphere)")
    p.add_argument("--seed", type=int, default=0, help="random_state")
    p.add_argument("--out", required=True, help="model file to write (.npz)")
    p.add_argument("--checkpoint", help="checkpoint file (default: OUT.ckpt.npz)")
    p.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=0,
                   help="write a checkpoint every N steps")
    p.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    add_cluster_args(p)
    p.set_defaults(func=run, solver_options={a.dest: a.option_strings[0]
                                             for a in g._group_actions})


def run(args: argparse.Namespace) -> int:
    from dkernel.data import open_dataset
    from dkernel.engine import connect

    if args.solver not in SOLVERS:
        raise ValueError(f"--solver {args.solver!r} is not available; choose one of {', '.join(sorted(SOLVERS))}")
    if os.path.isdir(args.out):
        raise ValueError(f"--out {args.out!r} is a folder; give a model file path such as model.npz")
    est = build(args)
    checkpoint = args.checkpoint or (args.out + ".ckpt.npz")
    if args.checkpoint_every or args.resume:
        est.set_params(checkpoint=checkpoint, checkpoint_every=args.checkpoint_every, resume=args.resume)
    if "verbose" in est.get_params():
        est.set_params(verbose=not args.quiet)
    open_dataset(args.store)  # fail on a missing / malformed store before starting a cluster
    with connect(scheduler=args.scheduler, n_workers=args.workers) as client:
        est.set_params(client=client)
        est.fit(args.store)
    est.set_params(client=None)
    est.save(args.out)
    if os.path.exists(checkpoint):
        os.unlink(checkpoint)
    print(f"saved {type(est).__name__} to {args.out}", file=sys.stderr)
    return 0
