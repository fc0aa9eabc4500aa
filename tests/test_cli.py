"""The command line end to end on zarr stores: fit, predict, evaluate, info, demo."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import zarr

from dkernel import load_model
from dkernel.cli import main
from dkernel.data import write_store
from dkernel.datasets import make_blobs_classification, make_dai_ridge


def test_fit_predict_evaluate_info_on_stores(client, tmp_path, capsys):
    X, y = make_blobs_classification(2000, 6)
    Xt, yt = make_blobs_classification(600, 6, random_state=1)
    train = write_store(tmp_path / "train.zarr", X, y, chunk_rows=500)
    test = write_store(tmp_path / "test.zarr", Xt, yt, chunk_rows=200)
    model = str(tmp_path / "model.npz")
    assert main(["fit", train, "--solver", "dsg", "--task", "classification", "--kernel", "gaussian",
                 "--bandwidth", "2", "--features", "512", "--epochs", "4", "--step-size", "50",
                 "--out", model, "--seed", "3", "--quiet"]) == 0
    m = load_model(model)
    assert m.random_state == 3 and m.bandwidth_ == 2.0

    assert main(["evaluate", model, test, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"accuracy"} and result["accuracy"] == m.score(Xt, yt)
    assert result["accuracy"] > 0.6

    pred = str(tmp_path / "pred.zarr")
    assert main(["predict", model, test, "--out", pred]) == 0
    stored = zarr.open_group(pred, mode="r")["y_pred"][:]
    assert np.array_equal(stored, m.predict(Xt))

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
    assert main(["evaluate", model, store, "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert set(result) == {"mse", "r2"} and result["r2"] > 0.5


def test_demo_runs_the_main_job_end_to_end(client, tmp_path, capsys):
    assert main(["demo", "--out", str(tmp_path / "demo"), "--rows", "4000", "--epochs", "3"]) == 0
    out = capsys.readouterr().out
    acc = json.loads(out[out.index("test metrics: ") + 14:].splitlines()[0])["accuracy"]
    assert acc > 0.6
    assert (tmp_path / "demo" / "model.npz").exists()


def test_console_script_errors_have_no_traceback(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "dkernel", "info", str(tmp_path / "nope.zarr")],
                          capture_output=True, text=True)
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("dkernel: error: no dataset store")
    assert "Traceback" not in proc.stderr
