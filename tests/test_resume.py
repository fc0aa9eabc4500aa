"""Nothing lost (docs/design.md §1): a fit killed with SIGKILL mid-way and restarted
with ``--resume`` ends with exactly the model of an uninterrupted fit; a resume
with other settings is refused by name; a failed fit leaves no model file."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import numpy as np
import pytest

from dkernel import DSGClassifier
from dkernel.cli import main
from dkernel.data.plan import ChunkPlan
from dkernel.data.store import write_store
from dkernel.datasets import make_store
from dkernel.io import load_model, read_npz, write_npz_atomic

# 8 chunks of 250 rows, 4 lanes, 8 rows per lane and step: 2 groups x 32 steps
# per epoch, 192 steps in 3 epochs -- a few seconds of ~10-30 ms steps, long
# enough to kill reliably in the middle.
N_ROWS, D, CHUNK, BATCH, EPOCHS, LANES, SEED = 2000, 4, 250, 32, 3, 4, 5
TOTAL_STEPS = sum(ChunkPlan((CHUNK,) * (N_ROWS // CHUNK), BATCH, LANES, SEED).steps_per_epoch(e)
                  for e in range(EPOCHS))
# Kill in the second epoch, second group: resume must skip a whole epoch and
# a group of the current one, then replay the rest of the group's steps.
KILL_AT = TOTAL_STEPS // 2 - 10
FIT_ARGS = ["--solver", "dsg", "--task", "classification", "--kernel", "gaussian",
            "--bandwidth", "2",
            "--features", "256", "--block-size", "32", "--batch-size", str(BATCH),
            "--epochs", str(EPOCHS), "--lanes", str(LANES), "--seed", str(SEED), "--quiet",
            # Dai's block steps: nothing is recomputed on resume, so the model is
            # bit-identical (the preconditioned default is tested to rounding below)
            "--preconditioner", "none"]


def _dkernel(*args: str, **kw) -> subprocess.Popen:
    """``python -m dkernel ...`` in its own session (process group), so a
    SIGKILL to the group also takes down its LocalCluster's worker processes."""
    return subprocess.Popen([sys.executable, "-m", "dkernel", *args], start_new_session=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, **kw)


def _checkpoint_step(path: Path) -> int:
    try:
        return int(read_npz(path)[1]["step"])
    except FileNotFoundError:
        return 0


def _group_gone(pgid: int, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    path = tmp_path_factory.mktemp("data") / "train.zarr"
    return make_store(path, N_ROWS, D, chunk_rows=CHUNK, kind="classification", random_state=2)


@pytest.fixture(scope="module")
def reference(store, client, tmp_path_factory):
    """The uninterrupted fit (no checkpoints), on the shared 2-worker LocalCluster."""
    out = tmp_path_factory.mktemp("reference") / "model.npz"
    assert main(["fit", store, *FIT_ARGS, "--scheduler", client.cluster.scheduler_address,
                 "--out", str(out)]) == 0
    return load_model(out)


@pytest.fixture(scope="module")
def killed(store, tmp_path_factory):
    """A fit in its own process, SIGKILLed once its checkpoint passed KILL_AT
    steps; returns (model path, checkpoint path, pristine copy of the checkpoint)."""
    return _killed_fit(store, tmp_path_factory.mktemp("killed"), FIT_ARGS, KILL_AT)


def _killed_fit(store: str, folder: Path, args: list[str], kill_at: int,
                every: int = 1) -> tuple[Path, Path, Path]:
    out, ckpt = folder / "model.npz", folder / "model.npz.ckpt.npz"
    proc = _dkernel("fit", store, *args, "--workers", "1", "--checkpoint-every", str(every),
                    "--out", str(out))
    try:
        deadline = time.monotonic() + 60
        while _checkpoint_step(ckpt) < kill_at:
            if proc.poll() is not None:
                pytest.fail(f"the fit ended (rc {proc.returncode}) before it could be killed:\n"
                            f"{proc.stdout.read()}")
            if time.monotonic() > deadline:
                pytest.fail(f"no checkpoint past step {kill_at} within 60 s")
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=30)
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL, "the fit finished before the kill landed"
    assert _group_gone(proc.pid), "worker processes outlived the SIGKILL of their group"
    copy = folder / "pristine.ckpt.npz"
    shutil.copyfile(ckpt, copy)
    return out, ckpt, copy


def test_fit_killed_mid_way_and_resumed_gives_the_uninterrupted_model(store, killed, reference):
    out, ckpt, _ = killed
    step = _checkpoint_step(ckpt)
    assert KILL_AT <= step < TOTAL_STEPS
    assert not out.exists(), "a killed fit must not leave a model file"
    proc = _dkernel("fit", store, *FIT_ARGS, "--workers", "1", "--checkpoint-every", "1",
                    "--resume", "--out", str(out))
    output, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, output
    assert not ckpt.exists(), "a finished fit removes its checkpoint"
    resumed = load_model(out)
    # Bit-identical: the resumed fit replays the same plan (chunk order, row
    # slices, feature seeds) from the exact saved state, on 1 worker where the
    # reference ran on 2.
    assert np.array_equal(resumed.coef_, reference.coef_)
    assert np.array_equal(resumed.classes_, reference.classes_)
    # the file records where the fit checkpointed; a refit of the loaded model
    # (on another machine, say) would have written and resumed there
    assert read_npz(out)[1]["params"]["checkpoint"] == str(ckpt)
    assert (resumed.checkpoint, resumed.checkpoint_every, resumed.resume) == (None, 0, False)
    # and the history: the killed epoch's entry counted only the steps after
    # the checkpoint (its running totals are checkpointed with the state now)
    assert [(e["steps"], e["rows"]) for e in resumed.history_] == \
        [(e["steps"], e["rows"]) for e in reference.history_]
    assert [e["loss"] for e in resumed.history_] == pytest.approx(
        [e["loss"] for e in reference.history_], rel=1e-6)


#: Early stopping that keeps its best epoch: 12 epochs, the best (measured) the
#: 10th since validation rows are drawn within each chunk (the 8th before),
#: whose validation accuracy no later epoch passes (the step is large).
EARLY_ARGS = ["--solver", "dsg", "--task", "classification", "--bandwidth", "2", "--epochs", "12",
              "--step-size", "200",
              "--batch-size", "250", "--lanes", "1", "--features", "256", "--feature-cache",
              "off", "--early-stopping", "--n-iter-no-change", "20", "--seed", "1", "--quiet",
              "--preconditioner", "none"]  # bit-identical on any cluster, as FIT_ARGS


def test_a_resumed_early_stopping_fit_keeps_its_best_epoch_and_history(store, client,
                                                                       tmp_path_factory):
    # the checkpoint held neither the best epoch's model and score nor the epochs'
    # history: the resumed fit picked its best among the epochs after the resume
    # (epoch 12 where the uninterrupted fit kept 6) and kept 9 of 20 history entries
    # (the CLI, 2000 rows, 20 epochs, killed in epoch 11)
    folder = tmp_path_factory.mktemp("early")
    ref_out = folder / "reference.npz"
    assert main(["fit", store, *EARLY_ARGS, "--scheduler", client.cluster.scheduler_address,
                 "--out", str(ref_out)]) == 0
    reference = load_model(ref_out)
    assert reference.best_epoch_ <= 10
    # killed in the epoch after the one after the best, which the resumed fit must return to
    steps_per_epoch = reference.history_[0]["steps"]
    out, ckpt, _ = _killed_fit(store, folder, EARLY_ARGS, every=3,
                               kill_at=(reference.best_epoch_ + 1) * steps_per_epoch
                               + steps_per_epoch // 2)
    assert main(["fit", store, *EARLY_ARGS, "--scheduler", client.cluster.scheduler_address,
                 "--checkpoint-every", "3", "--resume", "--out", str(out)]) == 0
    resumed = load_model(out)
    assert resumed.best_epoch_ == reference.best_epoch_
    assert np.array_equal(resumed.coef_, reference.coef_)
    assert resumed.validation_scores_ == reference.validation_scores_
    assert [e["epoch"] for e in resumed.history_] == list(range(1, 13))


def test_resume_continues_from_the_checkpointed_state(store, killed, reference, client, tmp_path):
    # Were the checkpoint ignored, the deterministic fit would still match the
    # reference; a perturbed saved state must therefore show in the result.
    _, _, pristine = killed
    arrays, meta = read_npz(pristine)
    arrays["coef"] = arrays["coef"] * 1.25  # (x2 would trip the divergence guard)
    ckpt = tmp_path / "perturbed.ckpt.npz"
    write_npz_atomic(ckpt, arrays, {k: v for k, v in meta.items()
                                    if k not in ("format", "format_version", "versions")})
    out = tmp_path / "model.npz"
    assert main(["fit", store, *FIT_ARGS, "--scheduler", client.cluster.scheduler_address,
                 "--checkpoint", str(ckpt), "--resume", "--out", str(out)]) == 0
    assert not np.array_equal(load_model(out).coef_, reference.coef_)


@pytest.mark.parametrize("flag, value, setting", [
    ("--seed", "6", f"random_state: the checkpoint's {SEED}, this fit's 6"),
    ("--batch-size", "64", f"batch_size: the checkpoint's {BATCH}, this fit's 64"),
    ("--features", "512", "n_blocks: the checkpoint's 8, this fit's 16"),
    # (lanes="auto" on a cluster of another width: the message named neither value)
    ("--lanes", "1", f"lanes: the checkpoint's {LANES}, this fit's 1); resume with "
                     f"lanes={LANES} (--lanes {LANES}; \"auto\" is one lane per worker thread)")])
def test_resume_with_other_settings_fails_naming_the_setting(store, killed, client, tmp_path,
                                                             capsys, flag, value, setting):
    _, _, pristine = killed
    ckpt = tmp_path / "model.ckpt.npz"
    shutil.copyfile(pristine, ckpt)
    args = list(FIT_ARGS)
    args[args.index(flag) + 1] = value
    out = tmp_path / "model.npz"
    rc = main(["fit", store, *args, "--scheduler", client.cluster.scheduler_address,
               "--checkpoint", str(ckpt), "--resume", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert err.count("\n") == 0 and err.startswith("dkernel: error: checkpoint"), err
    assert setting in err and "different fit" in err
    assert not out.exists()
    # the refused checkpoint is kept: it is still good for the fit it belongs to
    assert ckpt.read_bytes() == pristine.read_bytes()


def test_fit_failing_mid_way_leaves_no_model_file(client, tmp_path, capsys):
    X = np.random.default_rng(0).standard_normal((N_ROWS, D)).astype(np.float32)
    y = (X[:, 0] > 0).astype(np.int64)
    # NaN in a chunk of the last group of epoch 1: chunks are checked as they
    # are first read, so the fit fails after a group's worth of steps.
    plan = ChunkPlan((CHUNK,) * (N_ROWS // CHUNK), BATCH, LANES, SEED)
    bad_chunk = plan.groups(0)[-1][0]
    X[bad_chunk * CHUNK + 3, 1] = np.nan
    store = write_store(tmp_path / "nan.zarr", X, y, chunk_rows=CHUNK)
    out = tmp_path / "model.npz"
    rc = main(["fit", store, *FIT_ARGS, "--scheduler", client.cluster.scheduler_address,
               "--checkpoint-every", "1", "--out", str(out)])
    err = capsys.readouterr().err.strip()
    assert rc == 1
    assert err.count("\n") == 0 and "NaN" in err and f"row: {bad_chunk * CHUNK + 3}" in err, err
    assert not out.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []
    # It did fail mid-way; the last checkpoint is kept as the resume point.
    assert _checkpoint_step(tmp_path / "model.npz.ckpt.npz") > 0


def test_preconditioned_fit_resumes_to_the_uninterrupted_model_up_to_rounding(client, tmp_path,
                                                                             resume_mid_fit):
    # the preconditioner is recomputed on resume (it is not in the checkpoint);
    # its eigenvectors differed in the last bit while the workers received
    # arrays off their alignment (~1e-15 absolute).  Since the engine realigns
    # them the models were bit-identical in 3 of 3 runs, but BLAS may still
    # pick other kernels for 16- vs 64-byte aligned data, so rounding is allowed
    from dkernel import DSGClassifier

    X = np.random.default_rng(0).standard_normal((N_ROWS, D)).astype(np.float32)
    y = (X[:, 0] * X[:, 1] > 0).astype(np.int64)
    kw = dict(bandwidth=2.0, n_features=256, block_size=32, batch_size=128, n_epochs=3,
              lanes=LANES, random_state=SEED, client=client)
    reference = DSGClassifier(**kw).fit(X, y)
    ckpt = tmp_path / "p.ckpt.npz"
    DSGClassifier(checkpoint=str(ckpt), checkpoint_every=7, **{**kw, "n_epochs": 2}).fit(X, y)
    arrays, meta = read_npz(ckpt)
    assert 0 < meta["step"]
    # a checkpoint of the first 2 epochs is not one of this 3-epoch fit: refused by name
    with pytest.raises(ValueError, match="n_epochs"):
        DSGClassifier(checkpoint=str(ckpt), resume=True, **kw).fit(X, y)
    full, resumed, step = resume_mid_fit(lambda **c: DSGClassifier(**kw, **c), X, y)
    done = sum(h["steps"] for h in full.history_)
    assert 0 < step < done
    # the checkpoint carries the finished epochs' history and the running totals
    # of the epoch it was taken in: the history is the uninterrupted fit's
    assert [(h["epoch"], h["steps"], h["rows"]) for h in resumed.history_] == \
        [(h["epoch"], h["steps"], h["rows"]) for h in full.history_]
    assert reference.q_ > 0
    np.testing.assert_allclose(resumed.coef_, reference.coef_, rtol=1e-9, atol=1e-12)


def test_removing_a_checkpoint_removes_the_writes_a_killed_process_left(tmp_path):
    """A process killed inside write_npz_atomic leaves its temporary file; the
    fit that finishes (and removes the checkpoint) removes it too, and only
    the temporaries of that file."""
    from dkernel.files import remove_file, write_npz_atomic

    ckpt = tmp_path / "fit.ckpt.npz"
    write_npz_atomic(ckpt, {"a": np.zeros(3)}, {"step": 1})
    left = tmp_path / ".tmp-k1ll3d_x-fit.ckpt.npz"  # mkstemp's 8 characters, then the name
    left.write_bytes(b"half a file")
    other = tmp_path / ".tmp-abcd1234-x-fit.ckpt.npz"  # another file's (x-fit.ckpt.npz)
    other.write_bytes(b"")
    remove_file(ckpt)
    assert not ckpt.exists() and not left.exists() and other.exists()


def test_a_fingerprint_that_differs_by_rounding_still_resumes(tmp_path):
    # the same fit's step size, from a float32 eigensolve on the client, came out
    # 628.47545 in a process that also hosts the scheduler and 628.47622 in a
    # plain one; the resume in the other kind of process was refused
    from dkernel.engine.checkpoint import Checkpointer

    path = tmp_path / "c.npz"
    saved = {"solver": "dsg", "step_size": 628.4754452533532,
             "preconditioner": [38, 1.0, 12.345678], "encoding": ["regression", [], [0.5000001]]}
    Checkpointer(path, 1, saved).save({"coef": np.ones(3)}, 4)
    near = {**saved, "step_size": 628.4762162636853, "preconditioner": [38, 1.0, 12.345679]}
    state, step = Checkpointer(path, 1, near).load()
    assert step == 4 and np.array_equal(state["coef"], np.ones(3))
    for other in ({**saved, "step_size": 700.0}, {**saved, "preconditioner": [39, 1.0, 12.3]},
                  {**saved, "solver": "eigenpro"},
                  # the data's own numbers (y's mean) stay exact
                  {**saved, "encoding": ["regression", [], [0.5]]}):
        with pytest.raises(ValueError, match="belongs to a different fit"):
            Checkpointer(path, 1, other).load()


def test_a_fit_resumed_with_no_interval_goes_on_checkpointing_at_its_own(tmp_path):
    # `dkernel fit --resume` (no --checkpoint-every) wrote no more checkpoints:
    # a second Ctrl-C lost every step since the first
    from dkernel.engine.checkpoint import Checkpointer

    path = tmp_path / "c.npz"
    Checkpointer(path, 10, {"solver": "dsg"}).save({"coef": np.ones(3)}, 40)
    resumed = Checkpointer(path, 0, {"solver": "dsg"})
    assert not resumed.due(50)
    assert resumed.load()[1] == 40 and resumed.every == 10 and resumed.due(50)
    given = Checkpointer(path, 7, {"solver": "dsg"})  # an interval given wins
    given.load()
    assert given.every == 7
    # a checkpoint of an older plan says so, not "resume with the same data"
    Checkpointer(path, 1, {"solver": "dsg", "plan_version": 2}).save({"coef": np.ones(3)}, 4)
    with pytest.raises(ValueError, match="written by an older dkernel"):
        Checkpointer(path, 1, {"solver": "dsg", "plan_version": 3}).load()


def test_is_checkpoint_reads_the_metadata_and_names_a_newer_format(tmp_path):
    from dkernel.engine.checkpoint import Checkpointer, is_checkpoint
    from dkernel.files import NewerFormatError, read_npz_meta

    ckpt, model, text = tmp_path / "c.npz", tmp_path / "m.npz", tmp_path / "t.txt"
    Checkpointer(ckpt, 1, {"solver": "dsg"}).save({"coef": np.ones(3)}, 2)
    write_npz_atomic(model, {"coef": np.ones(3)}, {"kind": "model"})
    text.write_text("not a checkpoint\n")
    assert is_checkpoint(ckpt) and not is_checkpoint(model) and not is_checkpoint(text)
    assert read_npz_meta(ckpt)["step"] == 2
    newer = tmp_path / "newer.npz"
    write_npz_atomic(newer, {}, {"kind": "checkpoint", "format_version": 10**6})
    with pytest.raises(NewerFormatError, match="newer dkernel"):
        is_checkpoint(newer)


def test_a_damaged_checkpoint_is_named_as_one(store, client, tmp_path, capsys):
    """A checkpoint missing a part failed with a bare "dkernel: error:
    'fingerprint'", and a truncated one was called "not a checkpoint"."""
    from dkernel.engine.checkpoint import Checkpointer, not_a_checkpoint
    from dkernel.files import read_npz

    ckpt = tmp_path / "c.npz"
    Checkpointer(ckpt, 1, {"solver": "dsg"}).save({"coef": np.ones(3)}, 2)
    arrays, meta = read_npz(ckpt)
    write_npz_atomic(ckpt, arrays, {k: v for k, v in meta.items()
                                    if k not in ("fingerprint", "format", "format_version")})
    with pytest.raises(ValueError, match=r"c.npz' is damaged \(its fingerprint cannot be read\); "
                                         "delete it"):
        Checkpointer(ckpt, 1, {"solver": "dsg"}).load()
    half = tmp_path / "model.npz.ckpt.npz"
    half.write_bytes(ckpt.read_bytes()[:100])
    # (the zip's own words: "No data left in file" once the size check left it at the end)
    assert not_a_checkpoint(half).startswith("it cannot be read") and "not a zip file" in \
        not_a_checkpoint(half)
    assert main(["fit", store, *FIT_ARGS, "--scheduler", client.cluster.scheduler_address,
                 "--resume", "--out", str(tmp_path / "model.npz")]) == 1
    err = capsys.readouterr().err
    assert "exists and is not a checkpoint (it cannot be read" in err and "remove a damaged" in err


def test_a_checkpoint_of_other_data_is_refused_not_handed_back(client, tmp_path):
    """A finished checkpoint of (X, y_a) was accepted for (X, y_b), and its
    model returned as the fit of y_b (also with columns swapped, and across
    cross-validation folds): the data's identity is in the fingerprint."""
    from dkernel import DSGClassifier, DSGRegressor

    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 3)).astype(np.float32)
    y_a, y_b = (X[:, 0] > 0).astype(int), (X[:, 1] > 0).astype(int)
    ckpt = tmp_path / "c.npz"
    kw = dict(n_features=64, block_size=32, n_epochs=2, checkpoint=str(ckpt),
              checkpoint_every=1, resume=True, client=client)
    first = DSGClassifier(**kw).fit(X, y_a)
    again = DSGClassifier(**kw).fit(X, y_a)  # the same data resumes (finished: no steps)
    np.testing.assert_array_equal(again.coef_, first.coef_)
    with pytest.raises(ValueError, match=r"different fit \(differs in: data\)"):
        DSGClassifier(**kw).fit(X, y_b)
    reg = dict(kw, checkpoint=str(tmp_path / "r.npz"), bandwidth=1.0, preconditioner=None)
    DSGRegressor(**reg).fit(X, X[:, 0])
    with pytest.raises(ValueError, match=r"differs in: data"):
        DSGRegressor(**reg).fit(X[:, [1, 0, 2]], X[:, 0])
    # a store: rewritten with other values, it is other data
    store = write_store(tmp_path / "s.zarr", X, y_a, chunk_rows=200)
    DSGClassifier(**dict(kw, checkpoint=str(tmp_path / "s.npz"))).fit(store)
    write_store(store, X[::-1].copy(), y_a[::-1].copy(), chunk_rows=200, overwrite=True)
    with pytest.raises(ValueError, match=r"differs in: data"):
        DSGClassifier(**dict(kw, checkpoint=str(tmp_path / "s.npz"))).fit(store)


def test_a_checkpoint_path_holding_a_model_is_refused_and_a_lone_checkpoint_too(client, tmp_path):
    from dkernel import DSGRegressor

    rng = np.random.default_rng(1)
    X = rng.standard_normal((300, 2)).astype(np.float32)
    model = tmp_path / "model.npz"
    DSGRegressor(n_features=32, block_size=32, n_epochs=1, client=client).fit(X, X[:, 0]).save(
        str(model))
    before = model.read_bytes()
    with pytest.raises(FileExistsError, match="exists and is not a checkpoint"):
        DSGRegressor(n_features=32, block_size=32, n_epochs=1, checkpoint=str(model),
                     checkpoint_every=1, client=client).fit(X, X[:, 0])
    assert model.read_bytes() == before  # the model was overwritten by checkpoints
    # checkpoint alone wrote nothing, silently; resume alone resumed from nothing
    with pytest.raises(ValueError, match="checkpoint_every=0 writes none"):
        DSGRegressor(checkpoint=str(tmp_path / "c.npz")).fit(X, X[:, 0])
    with pytest.raises(ValueError, match="resume=True needs checkpoint"):
        DSGRegressor(resume=True).fit(X, X[:, 0])
    with pytest.raises(ValueError, match="checkpoint_every=5 needs checkpoint"):
        DSGRegressor(checkpoint_every=5).fit(X, X[:, 0])


def test_the_same_rows_rebuilt_under_new_dask_names_resume(client, tmp_path):
    """dask.delayed loads get a random name each time the array is built: the
    fingerprint's data record is the rows' content, so a resume (in a new
    process, which rebuilds the array) is not refused as other data."""
    import dask
    import dask.array as da

    from dkernel import DSGRegressor

    rng = np.random.default_rng(2)
    X = rng.standard_normal((800, 3)).astype(np.float32)
    y = X.sum(axis=1)

    def build():
        def load(a, i):
            return a[i * 200:(i + 1) * 200]
        parts = [dask.delayed(load)(arr, i) for arr in (X, y) for i in range(4)]
        Xd = da.concatenate([da.from_delayed(p, (200, 3), np.float32) for p in parts[:4]])
        yd = da.concatenate([da.from_delayed(p, (200,), np.float32) for p in parts[4:]])
        return Xd, yd

    kw = dict(n_features=64, block_size=32, n_epochs=1, checkpoint=str(tmp_path / "c.npz"),
              checkpoint_every=2, client=client)
    X1, y1 = build()
    X2, y2 = build()
    assert X1.name != X2.name
    first = DSGRegressor(**kw).fit(X1, y1)
    again = DSGRegressor(resume=True, **kw).fit(X2, y2)
    np.testing.assert_array_equal(again.coef_, first.coef_)


def test_a_python_fit_without_resume_says_it_writes_over_a_checkpoint(client, tmp_path):
    # a rerun without resume replaced an interrupted fit's checkpoint without a word
    # (the CLI refuses it unless --overwrite is given)
    import warnings

    from dkernel import DSGRegressor
    from dkernel.datasets import make_dai_ridge

    X, y = make_dai_ridge(600, 2)
    kw = dict(n_features=64, n_epochs=1, batch_size=100, checkpoint=str(tmp_path / "c.npz"),
              checkpoint_every=2, client=client)
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)  # none the first time
        DSGRegressor(**kw).fit(X, y)
    with pytest.warns(UserWarning, match="c.npz exists and this fit starts over"):
        DSGRegressor(**kw).fit(X, y)


def test_a_checkpoint_interval_the_fit_never_reaches_is_warned_about(client, tmp_path):
    # checkpoint_every=10 on a fit of 10 steps (DSG's automatic batch: 2 an
    # epoch) wrote its only checkpoint at the end, and deleted it: no
    # protection, and no word
    from dkernel import DSGRegressor

    X = np.random.default_rng(1).standard_normal((600, 2)).astype(np.float32)
    kw = dict(n_features=32, block_size=32, n_epochs=5, batch_size=300, client=client)
    with pytest.warns(UserWarning, match=r"checkpoint_every=10 steps, but this fit takes 10 "
                                         r"\(2 an epoch\).*checkpoint_every=2 writes one every 2"):
        DSGRegressor(checkpoint_every=10, checkpoint=str(tmp_path / "a.npz"), **kw).fit(
            X, X[:, 0])
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)
        DSGRegressor(checkpoint_every=9, checkpoint=str(tmp_path / "b.npz"), **kw).fit(
            X, X[:, 0])
    # one epoch: the suggestion is not the interval given (review)
    with pytest.warns(UserWarning, match=r"takes 2 \(2 an epoch\).*checkpoint_every=1 writes"):
        DSGRegressor(checkpoint_every=2, checkpoint=str(tmp_path / "c.npz"),
                     **{**kw, "n_epochs": 1}).fit(X, X[:, 0])


def test_a_checkpoint_of_a_store_whose_last_chunk_changed_is_refused(client, tmp_path):
    # the data check reads more than the first chunk: a store rewritten in its
    # last chunk only handed the old model back as the new fit
    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 3)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)
    kw = dict(n_features=64, block_size=32, n_epochs=2, checkpoint=str(tmp_path / "c.npz"),
              checkpoint_every=1, resume=True, client=client)
    store = write_store(tmp_path / "s.zarr", X, y, chunk_rows=200)
    with pytest.warns(UserWarning, match="no checkpoint at"):
        DSGClassifier(**kw).fit(store)
    y2 = y.copy()
    y2[400:] = 1 - y2[400:]  # the last chunk only
    write_store(store, X, y2, chunk_rows=200, overwrite=True)
    with pytest.raises(ValueError, match=r"differs in: data"):
        DSGClassifier(**kw).fit(store)


def test_a_checkpoint_interval_of_one_epoch_writes_at_every_epoch_end(client, tmp_path):
    # an interval that falls on epoch ends only (the other tests' intervals are
    # all due mid-epoch too): dropping the epoch-end checkpoint lost every one
    from dkernel.files import read_npz_meta

    rng = np.random.default_rng(0)
    X = rng.standard_normal((600, 3)).astype(np.float32)
    y = (X[:, 0] > 0).astype(int)
    kw = dict(n_features=64, block_size=32, n_epochs=2, batch_size=64, preconditioner=None,
              random_state=0, client=client)
    steps = DSGClassifier(**kw).fit(X, y).history_[0]["steps"]
    ckpt = tmp_path / "c.npz"
    DSGClassifier(checkpoint=str(ckpt), checkpoint_every=steps, **kw).fit(X, y)
    assert ckpt.exists() and read_npz_meta(ckpt)["step"] == 2 * steps
