"""A path starting with "~" means the home folder in the Python API too, as it
does to a shell and to the command line: ``model.save("~/m.npz")`` made a
folder named "~" in the working folder."""

from __future__ import annotations

import numpy as np
import pytest

from dkernel import DSGRegressor, load_model
from dkernel.data import write_store
from dkernel.data.ingest import ingest, ingest_npy
from dkernel.datasets import make_store
from dkernel.files import user_path
from dkernel.io import save_model


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home folder of this test's own, and a working folder apart from it."""
    home, work = tmp_path / "home", tmp_path / "work"
    home.mkdir()
    work.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(work)
    yield home
    assert not (work / "~").exists()  # nothing went to a folder named "~"


def test_user_paths_expand_a_leading_tilde_and_leave_urls_and_other_paths(home):
    assert user_path("~/m.npz") == str(home / "m.npz")
    assert user_path("s3://bucket/~/m.npz") == "s3://bucket/~/m.npz"
    assert user_path("m~.npz") == "m~.npz"


def test_every_public_path_takes_the_home_folder(client, home):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((300, 3)).astype(np.float32)
    y = np.sin(X[:, 0])

    make_store("~/made.zarr", 300, 3, client=client)
    write_store("~/written.zarr", X, y)
    np.save(home / "x.npy", X)
    np.save(home / "y.npy", y)
    ingest_npy("~/x.npy", "~/ingested.zarr", labels="~/y.npy")
    ingest("~/x.npy", "~/ingested2.zarr", format="npy", labels="~/y.npy")
    assert {"made.zarr", "written.zarr", "ingested.zarr", "ingested2.zarr"} <= {
        p.name for p in home.iterdir()}

    model = DSGRegressor(n_features=64, n_epochs=2, checkpoint="~/ck.npz", checkpoint_every=1,
                         client=client).fit("~/written.zarr")
    assert model.checkpoint == "~/ck.npz"  # (the parameter stays as given)
    model.save("~/m.npz")
    save_model(model, "~/m2.npz")
    for name in ("m.npz", "m2.npz"):
        assert (home / name).is_file()
        np.testing.assert_array_equal(load_model(f"~/{name}").predict(X[:20]),
                                      model.predict(X[:20]))
