"""
Quickstart
==========

A doubly stochastic kernel classifier on a zarr store, with early stopping;
its learning curve goes to quickstart.png when matplotlib is there.

    python examples/quickstart.py

``DKERNEL_EXAMPLE_SMALL=1`` uses fewer rows and epochs.
"""

import atexit
import os
import shutil
import tempfile

from dkernel import DSGClassifier, load_model
from dkernel.data import open_dataset
from dkernel.datasets import make_store
from dkernel.engine import connect

SMALL = os.environ.get("DKERNEL_EXAMPLE_SMALL", "") not in ("", "0")

if __name__ == "__main__":  # workers are spawned processes: keep the guard
    folder = tempfile.mkdtemp()
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # stores, models (and keys)
    n = 4000 if SMALL else 20000
    # the scheduler in $DASK_SCHEDULER_ADDRESS, or the LocalCluster dkernel starts
    # itself: one thread per worker process and malloc settings that reuse
    # chunk-sized buffers
    with connect() as client:
        # the workers write the stores, one chunk per task
        train = make_store(f"{folder}/train.zarr", n, 10, chunk_rows=n // 8, client=client)
        test = make_store(f"{folder}/test.zarr", n // 4, 10, chunk_rows=n // 8, random_state=1,
                          client=client)
        model = DSGClassifier(bandwidth=2.0, n_features=2048, n_epochs=4 if SMALL else 8,
                              early_stopping=True, client=client, verbose=True).fit(train)
        for entry in model.history_:  # one dict per epoch
            print(f"epoch {entry['epoch']}: loss {entry['loss']:.3f}, "
                  f"validation accuracy {entry['validation_score']:.3f}")
        print("kept epoch", model.best_epoch_)
        data = open_dataset(test)
        accuracy = model.score(data.X, data.y)
        print("test accuracy:", accuracy)
        if accuracy < 0.6:  # 3 classes: chance is 1/3
            raise RuntimeError(f"test accuracy {accuracy:.3f} is too close to chance")
        pred = model.predict(data.X)            # lazy dask array
        print("first predictions:", pred[:10].compute())
        model.save(f"{folder}/model.npz")
    print("reloaded:", load_model(f"{folder}/model.npz"))
    try:
        from dkernel.plot import plot_model

        # the same as: dkernel plot MODEL --out quickstart.png
        plot_model(f"{folder}/model.npz", "quickstart.png")
        print("learning curve: quickstart.png")
    except ImportError as exc:  # matplotlib is the optional 'plot' extra
        print(exc)
