"""Quickstart: a doubly stochastic kernel classifier on a zarr store, on a LocalCluster,
with early stopping; its learning curve goes to quickstart.png when matplotlib is there.

    python examples/quickstart.py
"""

import tempfile

from distributed import Client

from dkernel import DSGClassifier, load_model
from dkernel.data import open_dataset
from dkernel.datasets import make_store
from dkernel.engine import local_cluster

if __name__ == "__main__":  # workers are spawned processes: keep the guard
    folder = tempfile.mkdtemp()
    # the LocalCluster dkernel starts itself when given no client: one thread per
    # worker process and malloc settings that reuse chunk-sized buffers
    with local_cluster(2) as cluster, Client(cluster) as client:
        # the workers write the stores, one chunk per task
        train = make_store(f"{folder}/train.zarr", 20000, 10, chunk_rows=2500, client=client)
        test = make_store(f"{folder}/test.zarr", 5000, 10, chunk_rows=2500, random_state=1,
                          client=client)
        model = DSGClassifier(bandwidth=2.0, n_features=2048, n_epochs=8, early_stopping=True,
                              client=client, verbose=True).fit(train)
        for entry in model.history_:  # one dict per epoch
            print(f"epoch {entry['epoch']}: loss {entry['loss']:.3f}, "
                  f"validation accuracy {entry['validation_score']:.3f}")
        print("kept epoch", model.best_epoch_)
        data = open_dataset(test)
        print("test accuracy:", model.score(data.X, data.y))
        pred = model.predict(data.X)            # lazy dask array
        print("first predictions:", pred[:10].compute())
        model.save(f"{folder}/model.npz")
    print("reloaded:", load_model(f"{folder}/model.npz"))
    try:
        from dkernel.plot import plot_model

        plot_model(f"{folder}/model.npz", "quickstart.png")  # the same as: dkernel plot MODEL --out ...
        print("learning curve: quickstart.png")
    except ImportError as exc:  # matplotlib is the optional 'plot' extra
        print(exc)
