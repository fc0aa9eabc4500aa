"""TLS, tested: a CA and a node certificate made here, a scheduler and a worker
serving ``tls://`` started by ``deploy/local-cluster.sh``; a fit with the client
certificates (flags or Dask's environment variables) succeeds, and a client
without them is refused with one line that says what is missing."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("cryptography", reason="the TLS tests make certificates with 'cryptography'")

from _certs import make_ca_and_node  # noqa: E402
from _cluster import recipe, recipe_cluster  # noqa: E402

from dkernel import DSGClassifier  # noqa: E402
from dkernel.cli import main  # noqa: E402
from dkernel.data import open_dataset  # noqa: E402
from dkernel.datasets import make_store  # noqa: E402
from dkernel.io import load_model  # noqa: E402

FIT = ["--features", "128", "--block-size", "64", "--batch-size", "128", "--epochs", "2",
       "--bandwidth", "auto", "--seed", "3", "--quiet"]
#: FIT's settings for the Python API
SETTINGS = {"n_features": 128, "block_size": 64, "batch_size": 128, "n_epochs": 2,
            "bandwidth": "auto", "random_state": 3}


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return make_ca_and_node(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def tls_cluster(pki, tmp_path_factory):
    state = tmp_path_factory.mktemp("tls-cluster")
    with recipe_cluster(state, 1, "--tls-ca-file", pki["ca"], "--tls-cert", pki["cert"],
                        "--tls-key", pki["key"]) as address:
        yield address, state


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return make_store(tmp_path_factory.mktemp("data") / "train.zarr", 1000, 4, chunk_rows=250,
                      kind="classification", random_state=4)


def _accuracy(path, store) -> float:
    data = open_dataset(store)
    X, y = data.X.compute(scheduler="sync"), data.y.compute(scheduler="sync")
    return float((load_model(path).predict(X) == y).mean())


def _assert_same_as_in_process_fit(path, store, client) -> None:
    """The model fitted over TLS is, bit for bit, the one the in-process cluster
    fits with the same settings and the recorded width: the encrypted path changed
    nothing.  (Accuracy alone, > 0.6 on 3 classes, let a wrong fit through.)"""
    model = load_model(path)
    ref = DSGClassifier(**SETTINGS, lanes=model.lanes_, client=client).fit(store)
    assert model.bandwidth_ == ref.bandwidth_
    np.testing.assert_array_equal(model.coef_, ref.coef_)
    assert _accuracy(path, store) > 0.6  # and far above chance (~1/3)


def test_recipe_serves_tls_and_reports_its_status(tls_cluster):
    address, state = tls_cluster
    assert address.startswith("tls://127.0.0.1:")
    status = recipe("status", "--dir", str(state))  # reuses the PEM files recorded by start
    assert status.returncode == 0 and f"{address}, 1 worker(s) registered" in status.stdout


def test_fit_with_client_certificate_flags_succeeds(tls_cluster, pki, store, tmp_path, client):
    address, _ = tls_cluster
    out = tmp_path / "model.npz"
    assert main(["fit", store, *FIT, "--scheduler", address, "--tls-ca-file", pki["ca"],
                 "--tls-cert", pki["cert"], "--tls-key", pki["key"], "--out", str(out)]) == 0
    _assert_same_as_in_process_fit(out, store, client)


def test_fit_with_certificates_from_dask_environment_variables_succeeds(tls_cluster, pki, store,
                                                                        tmp_path, client):
    # The README's recipe, in a fresh process: no dkernel flag, only Dask's config.
    address, _ = tls_cluster
    out = tmp_path / "model.npz"
    env = {**os.environ, "DASK_DISTRIBUTED__COMM__REQUIRE_ENCRYPTION": "True",
           "DASK_DISTRIBUTED__COMM__TLS__CA_FILE": pki["ca"],
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT": pki["cert"],
           "DASK_DISTRIBUTED__COMM__TLS__CLIENT__KEY": pki["key"],
           "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.run([sys.executable, "-m", "dkernel", "fit", store, *FIT, "--scheduler",
                           address, "--out", str(out)], capture_output=True, text=True, env=env,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    _assert_same_as_in_process_fit(out, store, client)


def test_client_without_certificates_is_refused_in_one_line_and_writes_no_model(
        tls_cluster, store, tmp_path, capsys, monkeypatch):
    address, _ = tls_cluster
    for name in list(os.environ):
        if name.startswith("DASK_DISTRIBUTED__COMM__"):
            monkeypatch.delenv(name)
    out = tmp_path / "model.npz"
    rc = main(["fit", store, *FIT, "--scheduler", address, "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert err.count("\n") == 0, err
    assert err.startswith(f"dkernel: error: the scheduler at {address} needs TLS"), err
    for needed in ("--tls-ca-file", "--tls-cert", "--tls-key",
                   "DASK_DISTRIBUTED__COMM__TLS__CA_FILE",
                   "DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT"):
        assert needed in err, (needed, err)
    assert "ssl_context" not in err
    assert not out.exists() and os.listdir(tmp_path) == []


def test_client_with_only_the_ca_file_is_told_the_certificate_is_missing(tls_cluster, pki, store,
                                                                          tmp_path, capsys):
    address, _ = tls_cluster
    out = tmp_path / "model.npz"
    rc = main(["fit", store, *FIT, "--scheduler", address, "--tls-ca-file", pki["ca"],
               "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0
    assert "no --tls-cert (DASK_DISTRIBUTED__COMM__TLS__CLIENT__CERT)" in err, err
    assert "no --tls-ca-file" not in err
    assert not out.exists()


def test_a_certificate_without_its_key_or_certificates_for_a_tcp_address_are_named(
        tls_cluster, pki, store, tmp_path, capsys):
    # OpenSSL's "[SSL] PEM lib" became "cannot reach a Dask scheduler", and a
    # tcp:// address with the certificates "encryption required by Dask configuration"
    address, _ = tls_cluster
    out = tmp_path / "model.npz"
    rc = main(["fit", store, *FIT, "--scheduler", address, "--tls-ca-file", pki["ca"],
               "--tls-cert", pki["cert"], "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0, err
    assert "holds no private key; pass --tls-key" in err, err
    rc = main(["fit", store, *FIT, "--scheduler", address.replace("tls://", "tcp://"),
               "--tls-ca-file", pki["ca"], "--tls-cert", pki["cert"], "--tls-key", pki["key"],
               "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0, err
    assert f"use {address}" in err, err
    assert not out.exists()


def test_plain_tcp_client_is_refused_by_the_tls_scheduler(tls_cluster, store, tmp_path, capsys):
    address, _ = tls_cluster
    out = tmp_path / "model.npz"
    rc = main(["fit", store, *FIT, "--scheduler", address.replace("tls://", "tcp://"),
               "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0, err
    assert "cannot reach a Dask scheduler" in err and "needs a tls:// address" in err, err
    assert not out.exists()


def test_certificate_from_another_authority_is_refused(tls_cluster, store, tmp_path, capsys):
    address, _ = tls_cluster
    stranger = make_ca_and_node(tmp_path / "other-pki", name="stranger")
    out = tmp_path / "model.npz"
    rc = main(["fit", store, *FIT, "--scheduler", address, "--tls-ca-file", stranger["ca"],
               "--tls-cert", stranger["cert"], "--tls-key", stranger["key"], "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1 and err.count("\n") == 0, err
    # named as a TLS failure, with the flags to check (it said "cannot reach a Dask
    # scheduler ... start one with 'dask scheduler'", to a running one)
    assert "the TLS handshake with" in err and "--tls-ca-file" in err, err
    assert not out.exists()
