"""The command line end to end on zarr stores: fit, predict, evaluate, info, demo."""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest
import zarr
from sklearn.kernel_ridge import KernelRidge

from dkernel import DSGClassifier, load_model
from dkernel.cli import main
from dkernel.data import open_dataset, write_store
from dkernel.datasets import make_blobs_classification, make_dai_ridge


@pytest.mark.slow
def test_fit_predict_evaluate_info_on_stores(client, tmp_path, capsys):
    X, y = make_blobs_classification(2000, 6)
    Xt, yt = make_blobs_classification(600, 6, random_state=1)
    train = write_store(tmp_path / "train.zarr", X, y, chunk_rows=500)
    test = write_store(tmp_path / "test.zarr", Xt, yt, chunk_rows=200)
    model = str(tmp_path / "model.npz")
    assert (
        main(
            [
                "fit",
                train,
                "--solver",
                "dsg",
                "--task",
                "classification",
                "--kernel",
                "gaussian",
                "--bandwidth",
                "2",
                "--features",
                "512",
                "--epochs",
                "4",
                "--step-size",
                "50",
                "--out",
                model,
                "--seed",
                "3",
                "--quiet",
            ]
        )
        == 0
    )
    m = load_model(model)
    assert m.random_state == 3 and m.bandwidth_ == 2.0

    assert main(["evaluate", model, test, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"accuracy"} and result["accuracy"] == m.score(Xt, yt)
    # every flag reached the estimator: the Python API with the same settings
    # fits the same model bit for bit (a dropped or misnamed flag would not)
    api = DSGClassifier(kernel="gaussian", bandwidth=2.0, n_features=512, n_epochs=4,
                        step_size=50.0, random_state=3, client=client).fit(train)
    np.testing.assert_array_equal(m.coef_, api.coef_)
    # and that model is a working one: within 0.05 of exact kernel ridge with the
    # same kernel on these 2000 rows (0.05: 512 random features, 4 epochs)
    Y = 2.0 * np.eye(3)[y] - 1
    krr = KernelRidge(kernel="rbf", gamma=1 / (2 * 2.0**2), alpha=1e-3).fit(X, Y)
    assert result["accuracy"] >= np.mean(krr.predict(Xt).argmax(1) == yt) - 0.05

    pred = str(tmp_path / "pred.zarr")
    capsys.readouterr()
    assert main(["predict", model, test, "--out", pred]) == 0
    stored = zarr.open_group(pred, mode="r")["y_pred"][:]
    assert np.array_equal(stored, m.predict(Xt))
    # a long prediction says how far it is (it was silent until done)
    assert re.search(r"predict: \d+/\d+ chunks", capsys.readouterr().err)

    capsys.readouterr()
    assert main(["info", model, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["estimator"] == "DSGClassifier" and info["params"]["n_features"] == 512
    assert main(["info", train, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["n_rows"] == 2000 and info["n_chunks"] == 4


def test_regression_evaluate_reports_mse(client, tmp_path, capsys):
    X, y = make_dai_ridge(1500, 2)
    store = write_store(tmp_path / "r.zarr", X, y, chunk_rows=500)
    model = str(tmp_path / "r.npz")
    assert main(["fit", store, "--task", "regression", "--bandwidth", "1", "--features", "512",
                 "--epochs", "3", "--out", model, "--quiet"]) == 0
    capsys.readouterr()
    assert main(["evaluate", model, store, "--json"]) == 0
    out, err = capsys.readouterr()
    result = json.loads(out.strip().splitlines()[-1])
    assert set(result) == {"mse", "r2"} and result["r2"] > 0.5
    # pooled a chunk at a time (Chan et al.): the model's own score, and a line per chunk
    assert result["r2"] == pytest.approx(load_model(model).score(X, y), rel=1e-9)
    assert "evaluate: 3/3 chunks" in err
    # one row: score() warns and gives NaN; evaluate printed r2 0.0
    one = write_store(tmp_path / "one.zarr", X[:1], y[:1])
    _fails(capsys, ["evaluate", model, one], "R^2 is not defined on fewer than two rows, and "
           "the store has 1")


def test_evaluate_predicts_each_row_once(client, monkeypatch):
    # the MSE was a second reduction over the lazy predictions: every row's
    # features were generated twice
    import dask
    import dask.array as da

    from dkernel import DSGRegressor
    from dkernel.cli.predict import metrics
    from dkernel.features import FeatureMap

    X, y = make_dai_ridge(2000, 2)
    m = DSGRegressor(bandwidth=1.0, n_features=256, n_epochs=1, client=client).fit(X, y)
    Xd, yd = da.from_array(X, chunks=(500, 2)), da.from_array(np.asarray(y), chunks=500)
    calls = []
    real = FeatureMap.blocks
    monkeypatch.setattr(FeatureMap, "blocks", lambda *a, **k: calls.append(1) or real(*a, **k))
    with dask.config.set(scheduler="sync"):  # counted in this process
        pred = m.predict(Xd).compute()
        once = len(calls)
        result = metrics(m, Xd, yd)
    assert once > 0 and len(calls) == 2 * once
    assert result["mse"] == pytest.approx(float(np.mean((pred - y) ** 2)), rel=1e-9)
    assert result["r2"] == pytest.approx(m.score(X, y), rel=1e-9)


def _arrays(store) -> tuple[np.ndarray, np.ndarray]:
    g = zarr.open_group(str(store), mode="r")
    return g["X"][:], g["y"][:]


@pytest.mark.slow
def test_demo_runs_the_main_job_end_to_end(client, tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--rows", "4000", "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    acc = json.loads(out[out.index("test metrics: ") + 14 :].splitlines()[0])["accuracy"]
    # the printed figure is the saved model's on the test store
    (X, y), (Xt, yt) = (_arrays(tmp_path / "demo" / f"{n}.zarr") for n in ("train", "test"))
    assert acc == pytest.approx(float((load_model(tmp_path / "demo" / "model.npz").predict(Xt)
                                       == yt).mean()))
    # The classes are non-linear: measured, a linear model gets 0.49 and scikit-learn's
    # exact-kernel SVC (the demo's bandwidth 2) 0.77, the demo 0.78.  2048 random
    # features and 3 epochs may cost a little against the exact kernel: 0.05.
    from sklearn.linear_model import LogisticRegression
    from sklearn.svm import SVC

    assert acc > LogisticRegression(max_iter=2000).fit(X, y).score(Xt, yt) + 0.2
    assert acc >= SVC(gamma=1 / (2 * 2.0**2)).fit(X, y).score(Xt, yt) - 0.05


@pytest.mark.slow
def test_demo_prints_commands_that_remake_its_model_and_keeps_progress_off_stdout(client,
                                                                                   tmp_path,
                                                                                   capsys):
    # the printed fit lacked --seed (another model), and the [1/4]..[3/4] lines
    # went to stdout even with --quiet
    import shlex

    folder = tmp_path / "demo"
    assert main(["demo", "--out", str(folder), "--rows", "2000", "--features", "256",
                 "--epochs", "2", "--seed", "3"]) == 0
    captured = capsys.readouterr()
    assert "[1/4]" in captured.err and "[1/4]" not in captured.out
    fit = next(line for line in captured.out.splitlines() if "dkernel fit" in line)
    # run as printed (it failed on the model the demo had saved: "already exists")
    first = load_model(folder / "model.npz").coef_
    assert main([*shlex.split(fit)[1:], "--quiet"]) == 0
    assert np.array_equal(load_model(folder / "model.npz").coef_, first)
    assert main(["demo", "--out", str(folder), "--rows", "2000", "--features", "256",
                 "--epochs", "1", "--overwrite", "--quiet"]) == 0
    captured = capsys.readouterr()
    assert captured.err == "" and "[4/4]" in captured.out


def test_console_script_errors_have_no_traceback(tmp_path):
    # a missing model file was "no dataset store at 'nope.npz'"
    for name in ("nope.zarr", "nope.npz"):
        proc = subprocess.run([sys.executable, "-m", "dkernel", "info", str(tmp_path / name)],
                              capture_output=True, text=True)
        assert proc.returncode == 1
        assert proc.stderr.strip().startswith(f"dkernel: error: '{tmp_path / name}' does not "
                                              "exist: dkernel info reads a dataset")
        assert "Traceback" not in proc.stderr


def test_a_malformed_dask_configuration_file_is_one_line_naming_it(tmp_path):
    # every command, --help included, printed 53 lines of traceback
    (tmp_path / "mine.yaml").write_text("distributed:\n  worker: [a, b\n")
    env = {**os.environ, "DASK_CONFIG": str(tmp_path)}
    proc = subprocess.run([sys.executable, "-m", "dkernel", "--help"], capture_output=True,
                          text=True, env=env)
    assert proc.returncode == 1
    (line,) = proc.stderr.strip().splitlines()
    assert line.startswith(f"dkernel: error: A dask config file at '{tmp_path / 'mine.yaml'}' "
                           "is malformed") and line.endswith("; fix or remove that file")


def test_a_path_starting_with_tilde_is_in_the_home_folder(tmp_path, monkeypatch):
    # the shell leaves "--out=~/m.npz" (or a quoted "~/m.npz") as it is: a folder named
    # "~" appeared in the working directory (and "rm -rf ~" is how a user removes it)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.chdir(tmp_path)
    assert main(["make-store", "~/s.zarr", "--rows", "60", "--quiet", "--workers", "1"]) == 0
    assert (tmp_path / "home" / "s.zarr").is_dir() and not (tmp_path / "~").exists()


# --- refusals: what the command line cannot honour is a one-line error, exit 1 ---------------


def _fails(capsys, argv, message):
    capsys.readouterr()
    assert main(argv) == 1
    # (a prediction's progress lines, for the chunks written before the error)
    err = "".join(line for line in capsys.readouterr().err.splitlines(keepends=True)
                  if not re.match(r"(predict|transform|evaluate): \d+/\d+ chunks", line))
    assert message in err, err
    assert err.count("\n") == 1 and err.startswith("dkernel: error: ")


@pytest.fixture(scope="module")
def labelled(client, tmp_path_factory):
    """A small labelled store, a continuous-target store and a DSG classifier
    fitted on the first by the CLI (with early stopping, so it has a history)."""
    tmp = tmp_path_factory.mktemp("cli")
    X, y = make_blobs_classification(1200, 4)
    train = write_store(tmp / "train.zarr", X, y, chunk_rows=300)
    Xr, yr = make_dai_ridge(300, 4)
    continuous = write_store(tmp / "continuous.zarr", Xr, yr, chunk_rows=300)
    model = str(tmp / "model.npz")
    assert (
        main(
            [
                "fit",
                train,
                "--bandwidth",
                "2",
                "--features",
                "256",
                "--epochs",
                "3",
                "--early-stopping",
                "--n-iter-no-change",
                "3",
                "--out",
                model,
                "--quiet",
            ]
        )
        == 0
    )
    return {"dir": tmp, "train": train, "continuous": continuous, "model": model}


def test_fit_sphere_refuses_classification(labelled, capsys):
    out = labelled["dir"] / "sphere.npz"
    _fails(
        capsys,
        [
            "fit",
            labelled["train"],
            "--solver",
            "sphere",
            "--task",
            "classification",
            "--out",
            str(out),
        ],
        "--solver sphere fits regression only",
    )
    assert not out.exists()


def test_fit_kcca_refuses_a_labelled_store_unless_y_is_declared_a_view(labelled, capsys):
    _fails(
        capsys,
        ["fit", labelled["train"], "--solver", "kcca", "--out", str(labelled["dir"] / "c.npz")],
        "--solver kcca needs two views",
    )
    _fails(
        capsys,
        ["fit", labelled["train"], "--solver", "ksvd", "--out", str(labelled["dir"] / "c.npz")],
        "confirmed by --y-view",
    )


@pytest.mark.parametrize(
    "solver, extra, flag",
    [
        ("sphere", ["--kernel", "laplacian"], "--kernel"),
        ("sphere", ["--seed", "3"], "--seed"),
        ("kpca", ["--task", "regression"], "--task"),
        ("oja", ["--epochs", "3"], "--epochs"),
        ("kpca", ["--y-view"], "--y-view"),
        ("kpca", ["--early-stopping"], "--early-stopping"),
        ("oja", ["--steps", "power"], "--steps"),
    ],
)
def test_fit_refuses_an_option_the_solver_does_not_take(labelled, capsys, solver, extra, flag):
    _fails(
        capsys,
        [
            "fit",
            labelled["train"],
            "--solver",
            solver,
            *extra,
            "--out",
            str(labelled["dir"] / "x.npz"),
        ],
        f"{flag} does not apply to --solver {solver}",
    )


def test_fit_refuses_a_checkpoint_file_it_would_not_use(labelled, capsys):
    _fails(
        capsys,
        [
            "fit",
            labelled["train"],
            "--checkpoint",
            str(labelled["dir"] / "c.ckpt.npz"),
            "--out",
            str(labelled["dir"] / "x.npz"),
        ],
        "--checkpoint names the file of",
    )


def test_evaluate_refuses_a_classifier_on_continuous_targets(labelled, capsys):
    _fails(
        capsys,
        ["evaluate", labelled["model"], labelled["continuous"]],
        "not among DSGClassifier's classes [0, 1, 2]",
    )


@pytest.mark.parametrize("command", ["fit", "predict", "transform", "ingest", "plot", "demo"])
def test_every_command_that_writes_refuses_an_existing_output_without_overwrite(
    labelled, capsys, tmp_path, command
):
    out = tmp_path / "exists"
    out.mkdir()
    (tmp_path / "t.csv").write_text("1,2,0\n3,4,1\n")
    argv = {
        "fit": ["fit", labelled["train"], "--out", str(tmp_path / "m.npz")],
        "predict": ["predict", labelled["model"], labelled["train"], "--out", str(out)],
        "transform": ["transform", labelled["model"], labelled["train"], "--out", str(out)],
        "ingest": ["ingest", str(tmp_path / "t.csv"), "--out", str(out)],
        "plot": ["plot", labelled["model"], "--out", str(tmp_path / "m.png")],
        "demo": ["demo", "--out", str(tmp_path)],
    }[command]
    (tmp_path / "m.npz").write_bytes(b"keep")
    (tmp_path / "m.png").write_bytes(b"keep")
    (tmp_path / "model.npz").write_bytes(b"keep")
    _fails(capsys, argv, "already exists; pass --overwrite to replace it")
    assert (tmp_path / "m.npz").read_bytes() == b"keep" and not any(out.iterdir())


def test_predict_overwrites_with_overwrite_and_info_describes_the_prediction_store(
    labelled, capsys
):
    pred = str(labelled["dir"] / "pred.zarr")
    for extra in ([], ["--overwrite"]):
        assert (
            main(
                ["predict", labelled["model"], labelled["train"], "--out", pred, "--quiet", *extra]
            )
            == 0
        )
    capsys.readouterr()
    assert main(["info", pred, "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "predictions" and info["n_rows"] == 1200
    assert info["arrays"]["y_pred"]["shape"] == [1200]
    assert info["attrs"]["estimator"] == "DSGClassifier"
    assert main(["info", pred]) == 0
    assert "kind: predictions" in capsys.readouterr().out


def test_predict_refuses_to_overwrite_a_dataset_with_its_predictions(labelled, capsys):
    """`dkernel predict MODEL S --out S --overwrite` replaced the store it read
    with the predictions: X and y gone, rc 0."""
    import shutil

    copy = str(labelled["dir"] / "copy.zarr")
    shutil.copytree(labelled["continuous"], copy)
    for out, said in [(copy, "is the store the command reads"),
                      (labelled["train"], "holds a dataset")]:
        capsys.readouterr()
        assert main(["predict", labelled["model"], copy, "--out", out, "--overwrite",
                     "--quiet"]) == 1
        assert said in capsys.readouterr().err
    assert open_dataset(copy).y is not None and open_dataset(labelled["train"]).n_rows == 1200


def test_model_info_and_plot_show_the_training_history(labelled, capsys):
    capsys.readouterr()
    assert main(["info", labelled["model"], "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert [e["epoch"] for e in info["history"]] == [1, 2, 3]
    assert all(0 <= e["validation_score"] <= 1 for e in info["history"])
    assert main(["info", labelled["model"]]) == 0
    assert "history: 3 epoch(s); last: " in capsys.readouterr().out
    pytest.importorskip("matplotlib", reason="dkernel plot needs the plot extra (matplotlib)")
    fig = labelled["dir"] / "curve.png"
    assert main(["plot", labelled["model"], "--out", str(fig), "--quiet"]) == 0
    assert fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # no extension: matplotlib wrote curve.png beside the checked path "curve"
    bare = labelled["dir"] / "curve"
    _fails(capsys, ["plot", labelled["model"], "--out", str(bare)], "needs an image extension")
    assert not bare.exists() and fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_every_command_and_option_has_help_defaults_shown_and_quiet(capsys):
    from dkernel.cli import build_parser

    parser = build_parser()
    assert main.__module__ == "dkernel.cli"
    top = parser.format_help()
    assert "``" not in top and ":class:" not in top
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    for name, p in sub.choices.items():
        text = p.format_help()
        assert "``" not in text, name
        assert p.description, name
        for action in p._actions:
            assert action.help, f"{name} {action.option_strings or action.dest} has no help"
        flags = {f for a in p._actions for f in a.option_strings}
        assert "--quiet" in flags, name
        if name not in ("plot",):  # plot prints no numbers
            assert "--json" in flags, name
    fit_help = " ".join(sub.choices["fit"].format_help().split())
    assert (
        "(default: dsg)" in fit_help and "(default: 0)" in fit_help
    )  # --solver, --checkpoint-every
    ingest_flags = {f for a in sub.choices["ingest"]._actions for f in a.option_strings}
    assert "--n-inputs" in ingest_flags and "--n-features" not in ingest_flags


def test_json_output_of_fit_and_ingest(labelled, capsys, tmp_path):
    (tmp_path / "t.csv").write_text("1,2,0\n3,4,1\n5,6,0\n")
    capsys.readouterr()
    assert (
        main(
            [
                "ingest",
                str(tmp_path / "t.csv"),
                "--out",
                str(tmp_path / "t.zarr"),
                "--json",
                "--quiet",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["outputs"][0]["X"]["shape"] == [3, 2] and captured.err == ""
    assert (
        main(
            [
                "fit",
                str(tmp_path / "t.zarr"),
                "--bandwidth",
                "1",
                "--features",
                "16",
                "--epochs",
                "2",
                "--out",
                str(tmp_path / "m.npz"),
                "--json",
                "--quiet",
            ]
        )
        == 0
    )
    captured = capsys.readouterr()
    result = json.loads(captured.out)
    assert result["estimator"] == "DSGClassifier" and len(result["history"]) == 2
    assert captured.err == ""


def test_memory_outputs_are_refused_by_the_command_line(labelled, capsys):
    # a command's memory:// output is gone when its process ends: 'dkernel fit --out
    # memory://m.npz' said it saved the model, exit 0 (the overwrite policy of object
    # stores is tested on s3://, tests/test_object_store.py)
    for argv in (["predict", labelled["model"], labelled["train"], "--out",
                  "memory://dkernel-test/pred.zarr"],
                 ["fit", labelled["train"], "--out", "memory://m.npz"]):
        _fails(capsys, argv, "memory:// holds data only in the process that writes it")


def test_info_describes_folders_of_stores_and_checkpoints(tmp_path, capsys):
    from dkernel.engine.checkpoint import Checkpointer

    X, y = make_blobs_classification(50, 4)
    write_store(tmp_path / "data" / "train.zarr", X, y, chunk_rows=25)
    write_store(tmp_path / "data" / "test.zarr", X[:10], chunk_rows=25)
    capsys.readouterr()
    assert main(["info", str(tmp_path / "data"), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "folder" and set(info["stores"]) == {"train.zarr", "test.zarr"}
    assert info["stores"]["train.zarr"]["n_rows"] == 50 and info["stores"]["test.zarr"]["y"] is None
    ckpt = tmp_path / "m.ckpt.npz"
    Checkpointer(ckpt, 1, {"solver": "dsg"}).save({"coef": np.zeros((4, 2)), "scale": 1.0}, 7)
    assert main(["info", str(ckpt), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["kind"] == "checkpoint" and info["step"] == 7
    assert info["arrays"]["coef"][0] == [4, 2]
    # a group of groups: named, with the command that describes one ("empty" before)
    nested = zarr.open_group(str(tmp_path / "nested.zarr"), mode="w")
    nested.create_group("train").create_array("X", data=X)
    _fails(capsys, ["info", str(tmp_path / "nested.zarr")], "holds groups, not arrays (train); "
           f"describe one: dkernel info {tmp_path / 'nested.zarr'}/train")


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--workers", "-1"], "--workers must be at least 1, got -1"),
        (["--workers", "2", "--scheduler", "tcp://127.0.0.1:9"], "drop --workers"),
        (["--tls-cert", "client.pem"], "--tls-cert apply to a tls:// scheduler"),
        (["--task", "regression", "--quantile", "0.9"],
         "--quantile applies to --loss quantile, and the loss is squared"),
        (["--task", "regression", "--loss", "quantile", "--epsilon", "0.2"],
         "--epsilon applies to --loss huber or epsilon_insensitive, and the loss is quantile"),
        (["--validation-fraction", "0.3"], "--validation-fraction applies with --early-stopping"),
        (["--solver", "eigenpro", "--n-iter-no-change", "5"],
         "--n-iter-no-change applies with --early-stopping"),
        # an alias and its name: the last one won without a word
        (["--n-features", "256", "--features", "512"],
         "--n-features and --features both set n_features; give it once"),
        # a negative --theta was read as "none" (plain kernel SGD)
        (["--solver", "sphere", "--task", "regression", "--theta", "-1"],
         "theta must be None or in (0, 1], got -1.0"),
    ],
)
def test_fit_refuses_a_setting_it_would_ignore(labelled, capsys, extra, message):
    # each of these ran to the end (or, with --workers -1, hung) and used defaults
    out = labelled["dir"] / "ignored.npz"
    _fails(capsys, ["fit", labelled["train"], *extra, "--out", str(out)], message)
    assert not out.exists()


def test_a_store_row_with_nan_stops_predict_and_evaluate_naming_the_row(labelled, capsys):
    # predictions of such a row were NaN, and evaluate printed {"mse": NaN, ...}
    # (not even JSON) with exit code 0
    X, y = make_blobs_classification(400, 4, random_state=5)
    X[257, 2] = np.nan
    bad = write_store(labelled["dir"] / "nan.zarr", X, y, chunk_rows=100)
    with pytest.raises(ValueError, match="first bad row: 257"):
        load_model(labelled["model"]).predict(bad).compute()  # lazy until computed
    _fails(capsys, ["evaluate", labelled["model"], bad, "--json"], "first bad row: 257")
    _fails(capsys, ["predict", labelled["model"], bad, "--out",
                    str(labelled["dir"] / "p.zarr")], "first bad row: 257")
    assert not (labelled["dir"] / "p.zarr").exists()


def test_model_and_checkpoint_files_get_the_mode_the_umask_gives_any_file(tmp_path):
    # they were 0600 (tempfile's), unreadable by the other pods or users of a shared volume
    import os

    from dkernel.io import write_npz_atomic

    old = os.umask(0o022)
    try:
        path = tmp_path / "m.npz"
        write_npz_atomic(str(path), {"a": np.zeros(2)}, {})
        plain = tmp_path / "plain"
        plain.write_bytes(b"")
    finally:
        os.umask(old)
    assert os.stat(path).st_mode & 0o777 == os.stat(plain).st_mode & 0o777 == 0o644
    # a file replaced keeps its own mode: one an operator restricted is not widened
    os.chmod(path, 0o640)
    write_npz_atomic(str(path), {"a": np.ones(2)}, {})
    assert os.stat(path).st_mode & 0o777 == 0o640


def test_resume_without_a_checkpoint_says_it_starts_from_the_first_step(labelled, capsys):
    # a mistyped --checkpoint path restarted a long fit without a word
    out = labelled["dir"] / "fresh.npz"
    missing = labelled["dir"] / "typo.ckpt.npz"
    # (a warning, as the Python API gives it; on stderr, "dkernel: warning: UserWarning: ...")
    with pytest.warns(UserWarning, match=f"resume: no checkpoint at {re.escape(str(missing))}; "
                                         "the fit starts from the first step"):
        assert main(["fit", labelled["train"], "--features", "64", "--epochs", "1", "--resume",
                     "--checkpoint", str(missing), "--out", str(out)]) == 0


@pytest.mark.parametrize("extra, message",
                         [(["--dtype", "float64"], "--dtype float64: fashion-mnist"),
                          (["--format", "npy"], "--format npy applies to FILE")])
def test_ingest_fashion_mnist_refuses_options_it_does_not_honour(tmp_path, capsys, extra, message):
    # both were accepted and ignored (float32 written for --dtype float64)
    _fails(capsys, ["ingest", "fashion-mnist", "--out", str(tmp_path / "fm"), *extra], message)
    assert not (tmp_path / "fm").exists()


@pytest.mark.parametrize("extra", [["--workers", "0"], ["--scheduler", "tcp://127.0.0.1:1"],
                                   ["--tls-cert", "/nonexistent.pem"]])
def test_serial_ingest_refuses_cluster_flags_it_would_ignore(tmp_path, capsys, extra):
    # npy, idx and small CSV / libsvm files are read and written in this process:
    # --workers 0, --scheduler and --tls-* passed there with exit 0
    X, y = tmp_path / "x.npy", tmp_path / "y.npy"
    np.save(X, np.zeros((10, 2), np.float32))
    np.save(y, np.zeros(10, np.float32))
    _fails(capsys, ["ingest", str(X), "--labels", str(y), "--out", str(tmp_path / "s.zarr"),
                    *extra], "is read and written in this process")
    assert not (tmp_path / "s.zarr").exists()
    csv = tmp_path / "d.csv"
    csv.write_text("1,2,3\n4,5,6\n")
    _fails(capsys, ["ingest", str(csv), "--out", str(tmp_path / "c.zarr"), *extra],
           "this csv input is read and written in this process")


@pytest.mark.parametrize("solver", [["--solver", "dsg", "--features", "128"],
                                    ["--solver", "eigenpro"],
                                    ["--solver", "eigenpro", "--n-centers", "200"]],
                         ids=["dsg", "eigenpro", "eigenpro-all-rows"])
def test_fit_json_is_the_only_thing_on_stdout(labelled, capsys, tmp_path, solver):
    # the solvers' verbose lines ("dsg: 128 features, ...") went to stdout
    # ahead of the JSON object, so `| jq` failed
    out = tmp_path / "m.npz"
    assert main(["fit", labelled["train"], *solver, "--epochs", "1", "--json",
                 "--out", str(out)]) == 0
    captured = capsys.readouterr()
    assert json.loads(captured.out)["model"] == str(out)
    assert captured.err  # the status lines are there, on stderr


def test_bad_sizes_name_their_flag_and_a_y_of_other_outputs_is_named(labelled, capsys, tmp_path):
    # "expected non-negative integer", "cannot convert float NaN to integer",
    # "n_features must be > 0" and "total size of new array must be unchanged"
    out = str(tmp_path / "s.zarr")
    for argv, message in (
            (["make-store", out, "--rows", "10", "--seed", "-1"], "--seed must be at least 0"),
            (["make-store", out, "--gb", "nan"], "--gb must be a positive number"),
            (["make-store", out, "--rows", "0"], "--rows must be at least 1"),
            (["ingest", labelled["train"], "--n-inputs", "0", "--out", out],
             "--n-inputs must be at least 1")):
        _fails(capsys, argv, message)
    X, y = make_dai_ridge(300, 4)
    two = write_store(tmp_path / "two.zarr", X, np.stack([y, -y], axis=1))
    model = str(tmp_path / "r.npz")
    assert main(["fit", labelled["continuous"], "--task", "regression", "--features", "64",
                 "--epochs", "1", "--quiet", "--out", model]) == 0
    _fails(capsys, ["evaluate", model, two], "y has 2 column(s) but the model predicts 1")


def test_a_warning_is_one_line_on_stderr(labelled, tmp_path):
    # FitQualityWarning came out as Python's two lines: a file path and the
    # source line of the warnings.warn call
    proc = subprocess.run(
        [sys.executable, "-m", "dkernel", "fit", labelled["continuous"], "--task", "regression",
         "--features", "64", "--epochs", "2", "--step-size", "1e6", "--workers", "1", "--quiet",
         "--out", str(tmp_path / "m.npz")], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if "Warning" in x]
    assert line.startswith("dkernel: warning: FitQualityWarning: dsg: every update was undone")
    # (not ".py:" anywhere: a process's shutdown may print Python's own warnings)
    assert "warnings.warn" not in proc.stderr and "guard.py:" not in proc.stderr


@pytest.mark.parametrize("flag, value", [("--rows", "0"), ("--epochs", "0"), ("--features", "-1")])
def test_demo_checks_its_flags_before_writing_anything(tmp_path, capsys, flag, value):
    # --epochs 0 was refused once both stores were written; --rows 0 left an empty folder
    out = tmp_path / "demo"
    _fails(capsys, ["demo", "--out", str(out), flag, value], f"{flag} must be at least")
    assert not out.exists()


def test_fit_saves_the_model_before_its_cluster_closes(labelled, client, monkeypatch):
    # the model was written after the fit's connection and cluster closed: a
    # Ctrl-C or SIGTERM in those seconds of teardown threw the finished fit away
    from distributed import Client

    out, seen = labelled["dir"] / "early.npz", []
    close = Client.close

    def observed_close(self, *args, **kwargs):  # (the real close, after a look at --out)
        seen.append(out.exists())
        return close(self, *args, **kwargs)

    monkeypatch.setattr(Client, "close", observed_close)
    assert main(["fit", labelled["train"], "--features", "64", "--epochs", "1",
                 "--scheduler", client.scheduler.address, "--out", str(out)]) == 0
    assert seen and seen[0]


def test_evaluate_mse_of_a_two_output_regressor_is_the_mean_over_every_entry(client, tmp_path):
    # the single-output check (rows == entries) could not tell the two apart: two
    # outputs reported twice the mean squared error
    import dask.array as da

    from dkernel import DSGRegressor
    from dkernel.cli.predict import metrics

    rng = np.random.default_rng(0)
    X = rng.standard_normal((400, 2)).astype(np.float32)
    Y = np.c_[np.sin(X[:, 0]), np.cos(X[:, 1])] + 0.1 * rng.standard_normal((400, 2))
    m = DSGRegressor(bandwidth=1.0, n_features=256, n_epochs=2, client=client).fit(X, Y)
    result = metrics(m, da.from_array(X, chunks=(100, 2)), da.from_array(Y, chunks=(100, 2)))
    assert result["mse"] == pytest.approx(float(np.mean((m.predict(X) - Y) ** 2)), rel=1e-6)
    assert result["r2"] == pytest.approx(m.score(X, Y), rel=1e-9)


def test_info_names_the_last_epoch_of_the_history(client, tmp_path, capsys):
    from dkernel import DSGRegressor
    from dkernel.cli import main

    X = np.random.default_rng(0).standard_normal((400, 2)).astype(np.float32)
    m = DSGRegressor(bandwidth=1.0, n_features=256, n_epochs=3, client=client).fit(
        X, np.sin(X[:, 0]))
    m.save(str(tmp_path / "m.npz"))
    first, last = m.history_[0]["loss"], m.history_[-1]["loss"]
    assert f"{first:.4g}" != f"{last:.4g}"
    capsys.readouterr()
    assert main(["info", str(tmp_path / "m.npz")]) == 0
    line = next(s for s in capsys.readouterr().out.splitlines() if "history" in s)
    assert f"loss {last:.4g}," in line and f"loss {first:.4g}," not in line, line
