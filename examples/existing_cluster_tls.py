"""
Submitting to an existing cluster, over TLS
===========================================

dkernel runs on any Dask cluster: give the scheduler's address to the
command line (``--scheduler tls://HOST:8786``) or to
:func:`dkernel.engine.connect`, or create a ``distributed.Client`` and pass it
as ``client=``.  A ``tls://`` scheduler also needs the CA certificate and a
client certificate and key (``--tls-ca-file``, ``--tls-cert``,
``--tls-key``, or Dask's ``DASK_DISTRIBUTED__COMM__TLS__*`` variables);
``deploy/README.md`` shows how to start such a cluster.

Run it against your cluster::

    python existing_cluster_tls.py --scheduler tls://HOST:8786 \\
        --tls-ca-file ca.pem --tls-cert client.pem --tls-key client-key.pem

Without ``--scheduler`` it starts a throwaway TLS scheduler and worker in
this process, with temporary self-signed certificates, and submits to that.
The same fit runs through the Python API and through ``dkernel fit``; with
the same seed, data and cluster the two models are the same: bit for bit on
the deploy recipe's TLS cluster, to float32 rounding (2e-7) on the
throwaway one, whose worker threads share this process.
"""

import argparse
import atexit
import json
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np
from _fashion import check
from distributed import LocalCluster, Security

from dkernel import DSGClassifier, load_model
from dkernel.datasets import make_store
from dkernel.engine import connect, workers_info

SETTINGS = dict(bandwidth=2.0, n_features=512, n_epochs=3, random_state=0)


def throwaway_tls_cluster(folder):
    """A scheduler and one worker serving tls://, with temporary certificates
    written to PEM files as a real deployment would hand them out."""
    temporary = Security.temporary()
    files = {}
    for name, pem in (("ca", temporary.tls_ca_file), ("cert", temporary.tls_client_cert),
                      ("key", temporary.tls_client_key)):
        files[name] = os.path.join(folder, f"{name}.pem")
        with open(files[name], "w") as f:
            f.write(pem)
    cluster = LocalCluster(n_workers=1, threads_per_worker=2, processes=False,
                           protocol="tls://", security=temporary, dashboard_address=None)
    return cluster, files


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description="fit on an existing (TLS) Dask cluster")
    parser.add_argument("--scheduler", help="tls://HOST:PORT (default: start a throwaway one)")
    parser.add_argument("--tls-ca-file")
    parser.add_argument("--tls-cert")
    parser.add_argument("--tls-key")
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # stores, models (and keys)
    cluster = None
    if args.scheduler is None:
        cluster, pem = throwaway_tls_cluster(folder)
        args.scheduler = cluster.scheduler_address
        args.tls_ca_file, args.tls_cert, args.tls_key = pem["ca"], pem["cert"], pem["key"]
    print("scheduler:", args.scheduler)

    # %%
    # Without the certificates, the client is refused before it tries, with
    # one line that names what is missing.
    if args.scheduler.startswith("tls://"):
        try:
            with connect(scheduler=args.scheduler):
                pass
        except ConnectionError as exc:
            print("without certificates:", exc)
        else:
            raise RuntimeError("a tls:// scheduler accepted a client without certificates")

    # %%
    # Python: a distributed.Security with the PEM files, handed to connect().
    security = Security(tls_ca_file=args.tls_ca_file, tls_client_cert=args.tls_cert,
                        tls_client_key=args.tls_key, require_encryption=True)
    store = os.path.join(folder, "train.zarr")
    with connect(scheduler=args.scheduler, security=security) as client:
        print("workers:", list(workers_info(client)))
        make_store(store, 4000, 8, chunk_rows=1000, kind="classification", client=client)
        model = DSGClassifier(client=client, **SETTINGS).fit(store)
    print(f"Python API: trained {model.coef_.shape} coefficients")

    # %%
    # The command line: the same fit with --scheduler and the --tls-* flags.
    out = os.path.join(folder, "model.npz")
    cmd = [sys.executable, "-m", "dkernel", "fit", store, "--task", "classification",
           "--bandwidth", "2", "--n-features", "512", "--n-epochs", "3", "--random-state", "0",
           "--scheduler", args.scheduler, "--tls-ca-file", args.tls_ca_file,
           "--tls-cert", args.tls_cert, "--tls-key", args.tls_key, "--out", out,
           "--quiet", "--json"]
    print("$", " ".join(cmd[1:]))
    run = subprocess.run(cmd, capture_output=True, text=True)
    check(run.returncode == 0, f"dkernel fit failed:\n{run.stderr}")
    result = json.loads(run.stdout)
    print(f"dkernel fit wrote {result['model']} in {result['seconds']:.1f} s")
    difference = np.abs(load_model(out).coef_ - model.coef_).max()
    print(f"largest difference between the two models' coefficients: {difference:.3g}")
    check(difference < 1e-6, "the command line and the Python API fitted different models")
    if cluster is not None:
        cluster.close()
