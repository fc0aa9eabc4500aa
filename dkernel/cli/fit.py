"""``dkernel fit STORE --solver S --out MODEL``: train and save a model.

The solver options are generated from the estimators' parameter spec
(:mod:`dkernel.estimators.spec`): one flag per parameter, named after it
(``--n-epochs``) and still accepting the older spelling (``--epochs``), with
the defaults of every solver in its help.  They are checked against the spec
before the store is opened or a cluster started."""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from dkernel.cli import common
from dkernel.estimators.params import RUNTIME, add_flag, check_values
from dkernel.estimators.spec import AUTO_FROM, params_of

#: solver -> its estimators (classifier first where ``--task`` picks one).
SOLVERS = {"dsg": ("DSGClassifier", "DSGRegressor"),
           "eigenpro": ("EigenProClassifier", "EigenProRegressor"),
           "sphere": ("SphereRegressor",), "kpca": ("KernelPCA",), "kcca": ("KernelCCA",),
           "ksvd": ("KernelSVD",), "oja": ("StreamingKernelPCA",)}
_TASKS = ("dsg", "eigenpro", "sphere")
#: the spec's groups, in the order --help lists them, with their headings
_GROUPS = {"kernel": "kernel", "pool": "feature pool", "sgd": "SGD",
           "early stopping": "early stopping", "runtime": "runtime", "model": "model"}


def estimator_name(args: argparse.Namespace) -> str:
    """The estimator class ``--solver`` and ``--task`` pick."""
    if args.solver not in SOLVERS:
        raise ValueError(f"--solver {args.solver!r} is not available; choose one of "
                         f"{', '.join(sorted(SOLVERS))}")
    task = getattr(args, "task", None)
    if args.solver == "sphere" and task == "classification":
        raise ValueError("--solver sphere fits regression only (SphereRegressor); drop "
                         "--task classification, or use --solver dsg or eigenpro to classify")
    names = SOLVERS[args.solver]
    return names[-1] if task == "regression" else names[0]


def _typed_flag(args: argparse.Namespace, dest: str) -> str:
    """The spelling of option ``dest`` on the command line (an alias, if that was used)."""
    return next((w.split("=")[0] for w in getattr(args, "argv", None) or ()
                 if w.split("=")[0] in args.solver_options[dest]), args.solver_options[dest][0])


def parameters(args: argparse.Namespace) -> tuple[str, dict[str, Any]]:
    """(estimator name, its keyword arguments) from the solver options, checked
    against the spec: an option the estimator does not take is an error, not
    silently ignored."""
    name = estimator_name(args)
    spec = {p.name: p for p in params_of(name)}
    # options left out are absent (argparse.SUPPRESS): None may be a value (--theta 0)
    given = {d: getattr(args, d) for d in args.solver_options if hasattr(args, d)}
    takes = set(spec) | ({"y_view"} if args.solver in ("kcca", "ksvd") else set()) \
        | ({"task"} if args.solver in _TASKS else set())
    argv = [w.split("=")[0] for w in getattr(args, "argv", None) or ()]
    for d in given:  # an alias and its name both given: the last one won without a word
        typed = list(dict.fromkeys(w for w in argv if w in args.solver_options[d]))
        if len(typed) > 1:
            raise ValueError(f"{' and '.join(typed)} both set {d}; give it once")
    unused = sorted((_typed_flag(args, d) for d in given if d not in takes),
                    key=lambda f: argv.index(f) if f in argv else len(argv))
    other = {p.name for n in SOLVERS[args.solver] for p in params_of(n)} - set(spec)
    for d in (d for d in given if d in other):  # the regressor's, given to the classifier
        raise ValueError(f"{_typed_flag(args, d)} is a parameter of the regression losses and "
                         f"models ({SOLVERS[args.solver][-1]}); use it with --task regression")
    if unused:
        one = len(unused) == 1
        raise ValueError(f"{', '.join(unused)} {'does' if one else 'do'} not apply to --solver "
                         f"{args.solver}; drop {'it' if one else 'them'}")
    if args.solver in ("kcca", "ksvd") and not given.get("y_view"):
        raise ValueError(
            f"--solver {args.solver} needs two views with the same rows: a store whose "
            "y array holds the second view (n x d_y), confirmed by --y-view; the y of a "
            "labelled store is a label, not a view")
    if not given.get("early_stopping"):
        for d in ("validation_fraction", "n_iter_no_change"):
            if d in given:
                raise ValueError(f"{_typed_flag(args, d)} applies with --early-stopping; add "
                                 "--early-stopping or drop it")
    _check_loss_params(args, name, given)
    kw = {k: v for k, v in given.items() if k in spec}
    check_values(spec.values(), kw)
    return name, kw


def _check_loss_params(args: argparse.Namespace, name: str, given: dict) -> None:
    from dkernel.losses import LOSS_PARAMS

    loss = given.get("loss") or ("squared" if name == "DSGRegressor" else "softmax")
    for d in ("epsilon", "quantile"):
        if d in given and d not in LOSS_PARAMS.get(loss, {}):
            takers = " or ".join(k for k, v in LOSS_PARAMS.items() if d in v)
            raise ValueError(f"--{d} applies to --loss {takers}, and the loss is {loss}; "
                             f"add --loss {takers.split(' or ')[0]} or drop --{d}")


def build(args: argparse.Namespace) -> Any:
    """The unfitted estimator of ``--solver`` with its parameters checked."""
    import dkernel.estimators

    name, kw = parameters(args)
    est = getattr(dkernel.estimators, name)(**kw)
    est._check_params()  # the rules between parameters, before any data or cluster
    return est


def _help(name: str, owners: list[tuple[str, Any]]) -> str:
    """A solver option's help: its one-line doc, its solvers and their defaults."""
    solvers: dict[str, list[str]] = {}
    for solver, p in owners:
        shown = p.shown_default().replace('"', "")
        if solver not in solvers.setdefault(shown, []):
            solvers[shown].append(solver)
    everyone = [s for s in SOLVERS if any(s in v for v in solvers.values())]
    where = ", ".join(everyone) if len(everyone) < len(SOLVERS) - 1 else (
        "all" if len(everyone) == len(SOLVERS) else
        f"all but {next(s for s in SOLVERS if s not in everyone)}")
    defaults = "; ".join(d if len(solvers) == 1 else f"{d} ({', '.join(s)})"
                         for d, s in solvers.items())
    if "auto" in solvers and name in AUTO_FROM:
        defaults += f"; auto: {AUTO_FROM[name]}, resolved at fit"
    return f"{owners[0][1].summary} [{where}; default: {defaults}]".replace("%", "%%")


def register(sub: argparse._SubParsersAction) -> None:
    p = common.add_command(
        sub, "fit", "train a model on a dataset store",
        "Train a model on a zarr dataset store and save it (written atomically: "
        "a failed fit leaves no model file).")
    p.add_argument("store", help="dataset store: a zarr group with X (and y), local or s3:// etc.")
    p.add_argument("--out", required=True, metavar="MODEL", help="model file to write (.npz)")
    p.add_argument("--solver", default="dsg", help="algorithm: dsg (doubly stochastic "
                   "gradients), eigenpro, sphere (truncated kernel SGD on spheres), kpca, kcca, "
                   "ksvd, oja (streaming kernel PCA)")
    g = p.add_argument_group(
        "solver options", "One per estimator parameter, grouped as the spec groups them (the "
        "estimators' docstrings say more); each names the solvers that take it, and given to "
        "another solver it is an error.")
    g.add_argument("--task", choices=("classification", "regression"), default=argparse.SUPPRESS,
                   help="dsg, eigenpro: the estimator (default: classification); sphere: "
                   "regression only")
    g.add_argument("--y-view", dest="y_view", action="store_true", default=argparse.SUPPRESS,
                   help="kcca, ksvd (required): the store's y array is the second view")
    owners: dict[str, list[tuple[str, Any]]] = {}
    for solver, names in SOLVERS.items():
        for q in (q for n in names for q in params_of(n)):
            if q.option is not None and q.name not in RUNTIME:
                owners.setdefault(q.name, []).append((solver, q))
    groups = {"": g}
    order = list(_GROUPS)
    for name, owned in sorted(owners.items(), key=lambda kv: order.index(kv[1][0][1].group)):
        group = owned[0][1].group
        if group not in groups:
            groups[group] = p.add_argument_group(f"{_GROUPS[group]} options")
        add_flag(groups[group], name, [q for _, q in owned], _help(name, owned))
    c = p.add_argument_group("checkpoints")
    c.add_argument("--checkpoint", metavar="FILE", help="checkpoint file (default: MODEL.ckpt.npz)")
    c.add_argument("--checkpoint-every", dest="checkpoint_every", type=int, default=0,
                   metavar="N", help="write a checkpoint every N steps (0: never; --resume alone "
                   "keeps the checkpoint's N)")
    c.add_argument("--resume", action="store_true", help="continue from the checkpoint")
    common.add_output_args(p, overwrite=True)
    common.add_cluster_args(p)
    p.set_defaults(func=run, solver_options={a.dest: a.option_strings for grp in groups.values()
                                             for a in grp._group_actions})


def _same_file(a: str, b: str) -> bool:
    """Whether two --out style paths (local, file:// or URLs) name one file."""
    if "://" in a.removeprefix("file://") or "://" in b.removeprefix("file://"):
        return a.rstrip("/") == b.rstrip("/")
    return os.path.abspath(a.removeprefix("file://")) == os.path.abspath(b.removeprefix("file://"))


def run(args: argparse.Namespace) -> int:
    if os.path.isdir(args.out):
        raise ValueError(f"--out {args.out!r} is a folder; give a model file path such as "
                         "model.npz")
    common.check_output(args.out, args.overwrite, model=True)
    if args.checkpoint and not (args.checkpoint_every or args.resume):
        raise ValueError("--checkpoint names the file of --checkpoint-every N / --resume; "
                         "add one of them (alone it would be ignored)")
    parameters(args)  # the spec's checks, before Dask is imported
    from dkernel.data import open_dataset
    from dkernel.engine.checkpoint import not_a_checkpoint
    from dkernel.io import file_exists, remove_file

    est = build(args)
    checkpoint = args.checkpoint or (args.out + ".ckpt.npz")
    if _same_file(checkpoint, args.out):
        # the fit deletes its checkpoint once the model is saved: the model with it
        raise ValueError(f"--checkpoint {checkpoint!r} is the --out file; the checkpoint is "
                         "deleted when the model is saved, so name another file (default: "
                         "MODEL.ckpt.npz)")
    if args.checkpoint_every or args.resume:
        common.check_writable(checkpoint, "--checkpoint")
        est.set_params(checkpoint=checkpoint, checkpoint_every=args.checkpoint_every,
                       resume=args.resume)
    why = file_exists(checkpoint) and not_a_checkpoint(checkpoint)
    if why:  # the fit would write its checkpoints over it and delete it at the end
        raise FileExistsError(f"--checkpoint {checkpoint!r} exists and is not a checkpoint "
                              f"({why}); name another file, or remove a damaged one")
    if not args.resume and file_exists(checkpoint):
        # a rerun without --resume would start over and, once done, delete the
        # checkpoint: the interrupted fit's progress lost without a word
        if not args.overwrite:
            raise FileExistsError(
                f"checkpoint {checkpoint} holds the progress of an unfinished fit; pass "
                "--resume to continue it, or --overwrite to start over (the checkpoint is "
                "deleted)")
        remove_file(checkpoint)
        common.status(args, f"--overwrite: deleted the checkpoint {checkpoint}; starting over")
    if args.resume and file_exists(checkpoint):  # (a missing one: the fit warns)
        common.status(args, f"resuming from {checkpoint}")
    if "verbose" in est.get_params():
        est.set_params(verbose=not args.quiet)
    open_dataset(args.store)  # fail on a missing / malformed store before starting a cluster
    start = time.perf_counter()
    with common.connect_cluster(args) as client:
        est.set_params(client=client)
        est.fit(args.store)
        seconds = time.perf_counter() - start
        _save(est.set_params(client=None), args, checkpoint)  # (before the cluster closes)
    cache = getattr(est, "feature_cache_", None)  # the feature solvers' resolved choice
    common.status(args, f"saved {type(est).__name__} to {args.out} ({seconds:.1f} s"
                  + (f", feature_cache {cache})" if cache else ")"))
    if args.json:
        common.emit(args, {"model": args.out, "estimator": type(est).__name__, "seconds": seconds,
                    "feature_cache": cache, "history": getattr(est, "history_", None)})
    return 0


def _save(est: Any, args: argparse.Namespace, checkpoint: str) -> None:
    """Saved while the cluster is up: a signal in its teardown lost the finished model."""
    from dkernel.estimators.model_file import write_model
    from dkernel.io import remove_file
    try:  # (without --overwrite, a model another run saved at --out meanwhile is kept)
        write_model(est, args.out, exclusive=not args.overwrite)
    except OSError as e:
        if isinstance(e, FileExistsError):
            raise
        raise OSError(e.errno, f"--out {args.out!r} could not be written: {e.strerror or e}") from e
    remove_file(checkpoint)  # a local path or a URL (s3://...)
