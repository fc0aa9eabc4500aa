"""The coordinator loop: plans, reductions, scans and determinism."""

from __future__ import annotations

import logging
import re
import time
import warnings

import dask.array as da
import numpy as np
import pytest
from distributed import Client, LocalCluster, get_task_stream, get_worker

from dkernel import DSGClassifier, DSGRegressor, EigenProRegressor, FitQualityWarning
from dkernel.data import ChunkPlan, open_dataset
from dkernel.datasets import make_blobs_classification, make_dai_ridge
from dkernel.engine import Engine, EngineOptions, tree_sum
from dkernel.engine.chunks import thread_slots
from dkernel.engine.program import StepProgram


def test_every_row_is_used_exactly_once_per_epoch_and_order_changes_between_epochs():
    plan = ChunkPlan((100, 100, 100, 37), batch_size=64, lanes=2, random_state=3)
    offsets = np.concatenate([[0], np.cumsum(plan.row_chunks)])
    seen = []
    for epoch in (0, 1):
        rows = []
        for group in plan.groups(epoch):
            for c in group:
                slices = plan.row_slices(epoch, c)
                assert len(slices) == plan.group_steps((c,))
                for sl in slices:  # a short remainder joins the last slice
                    assert plan.per_lane // 2 <= len(sl) < 1.5 * plan.per_lane or len(slices) == 1
                    rows.extend(offsets[c] + sl)
        assert sorted(rows) == list(range(337))
        seen.append(rows)
    assert seen[0] != seen[1]


def test_a_short_remainder_joins_the_last_slice_instead_of_costing_a_step():
    # Fashion-MNIST's chunks at EigenPro's batch: 4 x 2047 rows and 4 left over
    plan = ChunkPlan((8192, 3200, 2656), batch_size=4093, lanes=2, random_state=0)
    assert [len(s) for s in plan.row_slices(0, 0)] == [2047, 2047, 2047, 2051]
    # a remainder over half a slice is a step of its own
    assert [len(s) for s in plan.row_slices(0, 1)] == [2047, 1153]
    assert [len(s) for s in plan.row_slices(0, 2)] == [2656]
    # 4 + 1 or 2 + 4 steps, by which chunk of lane class 0 comes first (7 before the merge)
    expected = {((0, 1), (2,)): 5, ((2, 1), (0,)): 6}[tuple(plan.groups(0))]
    assert plan.steps_per_epoch(0) == expected


def test_a_step_ships_its_rows_as_a_few_integers_that_the_worker_expands():
    """A lane's slice leaves the client as (rows, width, seed, epoch, chunk, index):
    65536 row indices were 512 KB a task, 0.5 GB a step at 1000 lanes."""
    import pickle

    plan = ChunkPlan((65536, 65536, 1000), batch_size=2 * 32768, lanes=2, random_state=3)
    for c in range(3):
        whole = np.concatenate(plan.row_slices(1, c))
        assert np.array_equal(np.sort(whole), np.arange(plan.row_chunks[c]))  # every row once
        for j in range(plan.n_slices(c)):
            piece = plan.row_slice(1, c, j)
            assert len(pickle.dumps(piece)) < 300
            assert len(piece) == len(piece.rows()) == len(plan.row_slices(1, c)[j])
    assert len(pickle.dumps(plan.row_slices(1, 0)[0])) > 262144


def test_plan_depends_on_lanes_not_on_workers():
    a = ChunkPlan((50,) * 6, 40, 3, 7)
    b = ChunkPlan((50,) * 6, 40, 3, 7)
    assert a.groups(2) == b.groups(2)
    assert all(np.array_equal(x, y) for x, y in zip(a.row_slices(2, 4), b.row_slices(2, 4)))


def test_a_group_takes_one_chunk_of_each_lane_class():
    # chunk c lives on worker c mod n_workers: with 2 or 4 workers and 4 lanes
    # every step's tasks are spread evenly, whatever the epoch's permutation
    plan = ChunkPlan((64,) * 11, 64, 4, 5)
    for epoch in range(3):
        groups = plan.groups(epoch)
        assert sorted(c for g in groups for c in g) == list(range(11))
        for g in groups[:-1]:
            assert sorted(c % 4 for c in g) == [0, 1, 2, 3]
        assert len({c % 4 for c in groups[-1]}) == len(groups[-1])
    assert plan.groups(0) != plan.groups(1)


def test_cache_keeps_a_runs_first_blocks_when_its_cycle_outgrows_the_budget():
    import dask

    from dkernel.engine import cache

    block = np.ones(1000, np.float64)  # 8 kB
    computed = []

    def fill(i):
        computed.append(i)
        return block.copy()

    cache.clear()
    try:
        with dask.config.set({"dkernel.cache-fraction": 1.0}):
            limit = cache.budget()
            # cache-live-seconds 0: run a counts as finished once it stops asking
            # (test_shared_cluster.py covers a run that is still going)
            with dask.config.set({"dkernel.cache-fraction": 3.5 * block.nbytes / limit,
                                  "dkernel.cache-live-seconds": 0}):
                for _ in range(3):  # three epochs of a cycle of 5 blocks, room for 3
                    for i in range(5):
                        cache.lookup_or_fill(("run-a", i), lambda i=i: fill(i), block.nbytes,
                                             owner="a")
                # plain LRU would miss all 15; the run keeps blocks 0-2 and declines 3-4
                assert computed == [0, 1, 2]
                assert cache.stats()["hits"] == 6 and cache.stats()["declined"] == 6
                # another run evicts the first run's least recently used blocks
                cache.lookup_or_fill(("run-b", 0), lambda: fill("b"), block.nbytes, owner="b")
                assert computed[-1] == "b" and cache.stats()["entries"] == 3
                # a hit makes an earlier run's block the current run's
                assert cache.lookup_or_fill(("run-a", 2), lambda: fill("x"), block.nbytes,
                                            owner="b") is not None
                assert cache.lookup_or_fill(("run-b", 1), lambda: fill("b1"), block.nbytes,
                                            owner="b") is not None
                assert ("run-a", 1) not in cache._entries and ("run-a", 2) in cache._entries
    finally:
        cache.clear()


def _moments(payload, X, y):
    return {"s": X.sum(axis=0).astype(np.float64), "ss": (X.astype(np.float64) ** 2).sum(),
            "count": X.shape[0]}


def test_map_reduce_sums_over_every_chunk_on_the_workers(client):
    X = np.random.default_rng(0).standard_normal((1000, 3)).astype(np.float32)
    data = open_dataset(da.from_array(X, chunks=(128, 3)))
    out = Engine(client).map_reduce(data, _moments)
    assert out["count"] == 1000
    np.testing.assert_allclose(out["s"], X.astype(np.float64).sum(axis=0), rtol=1e-5)


def _alignment(payload, X, y):
    return {"offsets": np.array([payload["W"].ctypes.data % 16, X.ctypes.data % 16]),
            "s": X.astype(np.float64).sum(axis=0) @ payload["W"][:3, :1].astype(np.float64)}


def test_arrays_reach_the_partials_aligned(client):
    # Arrays sent over the network can start at any byte of the message buffer,
    # and BLAS ran at half speed on them: the engine hands partials aligned
    # copies.  A 10 MB payload is broadcast (scattered) and in-memory chunks are
    # scattered, the two routes on which the misalignment was seen.
    rng = np.random.default_rng(1)
    X = rng.standard_normal((2000, 3)).astype(np.float32)
    W = rng.standard_normal((3, 900_000)).astype(np.float32)
    out = Engine(client).map_reduce(open_dataset(X, chunk_rows=500), _alignment, {"W": W})
    assert out["offsets"].tolist() == [0, 0]
    np.testing.assert_allclose(out["s"], X.astype(np.float64).sum(axis=0) @ W[:3, :1], rtol=1e-4)


def test_aligned_copies_only_misaligned_arrays():
    from dkernel.backend import align_arrays, aligned

    raw = np.frombuffer(bytearray(4 * 100 + 3), dtype=np.uint8)[3:].view(np.float32)
    raw = raw.reshape(10, 10)  # starts 3 bytes off a 16-byte boundary
    ok = np.ones((10, 10), dtype=np.float32)
    assert raw.ctypes.data % 16 and aligned(ok) is ok
    fixed = aligned(raw)
    assert fixed.ctypes.data % 16 == 0 and np.array_equal(fixed, raw)
    d = {"a": raw, "b": ok, "c": 3}
    assert align_arrays(d) is d and d["b"] is ok and d["a"].ctypes.data % 16 == 0


def test_aligned_tree_copies_misaligned_arrays_at_any_depth_and_leaves_the_input_alone():
    from dkernel.backend import aligned_tree

    raw = np.frombuffer(bytearray(4 * 100 + 3), dtype=np.uint8)[3:].view(np.float32)
    ok = np.ones(100, dtype=np.float32)
    tree = {"a": ok, "b": [ok, (raw, 2)], "c": "x"}
    out = aligned_tree(tree)
    assert out is not tree and tree["b"][1][0] is raw  # (a fold's input is a worker's result)
    assert out["a"] is ok and out["b"][0] is ok and out["c"] == "x"
    assert out["b"][1][0].ctypes.data % 16 == 0 and np.array_equal(out["b"][1][0], raw)
    assert isinstance(out["b"][1], tuple) and out["b"][1][1] == 2
    clean = {"a": ok, "b": [ok, (ok, 2)]}
    assert aligned_tree(clean) is clean  # nothing copied where nothing travelled
    # a namedtuple or a dict subclass keeps its type (rebuilt plain, .V was lost)
    from collections import OrderedDict, namedtuple

    State = namedtuple("State", "V n")
    state = State(raw, 3)
    assert aligned_tree(state) is state and aligned_tree(OrderedDict(a=raw))["a"] is raw


@pytest.mark.parametrize("mode, compacts", [("always", True), ("madvise", True),
                                            ("defer+madvise", True), ("defer", False),
                                            ("never", False)])
def test_the_thp_defrag_modes_that_compact_in_the_page_fault(tmp_path, mode, compacts):
    from dkernel.backend import _compacts_in_fault

    modes = ["always", "defer", "defer+madvise", "madvise", "never"]
    f = tmp_path / "defrag"
    f.write_text(" ".join(f"[{m}]" if m == mode else m for m in modes) + "\n")
    assert _compacts_in_fault(str(f)) is compacts
    assert _compacts_in_fault(str(tmp_path / "absent")) is False


def test_cache_blocks_are_allocated_without_huge_page_advice_where_it_compacts(monkeypatch):
    import threading

    from dkernel import backend
    from dkernel.engine import cache

    if backend._HUGEPAGE_SETTER is None:
        pytest.skip("this NumPy has no huge-page switch")

    def advice():  # the switch returns its previous value
        before = backend._HUGEPAGE_SETTER(True)
        backend._HUGEPAGE_SETTER(before)
        return before

    monkeypatch.setattr(backend, "_COMPACTS", True)
    before = advice()  # NumPy's default, or what NUMPY_MADVISE_HUGEPAGE set
    seen = []
    cache.clear()
    try:
        cache.lookup_or_fill(("advice", 0), lambda: seen.append(advice()) or np.ones(4), 32)
        assert seen == [False] and advice() is before
        # two threads inside at once: the advice stays off until the last one leaves
        inside, leave = threading.Barrier(2), threading.Event()

        def hold():
            with backend.plain_pages():
                inside.wait(timeout=60)
                leave.wait(timeout=60)

        t = threading.Thread(target=hold)
        t.start()
        with backend.plain_pages():
            inside.wait(timeout=60)  # (bounded: a broken thread fails the test, not hangs it)
        assert advice() is False
        leave.set()
        t.join(timeout=60)
        assert advice() is before
        # where the kernel does not compact in the fault, nothing changes
        monkeypatch.setattr(backend, "_COMPACTS", False)
        with backend.plain_pages():
            assert advice() is before
    finally:
        cache.clear()


def _prepare_rows(payload, X, y):
    return X[:, 0].astype(np.float64)


def _fold_append(state, prepared, payload):
    # order-sensitive fold: a polynomial hash of the sequence of values
    return {"h": state["h"] * 1.0001 + prepared.sum(), "n": state["n"] + prepared.size}


def test_scan_threads_state_through_chunks_in_order(client):
    X = np.arange(600, dtype=np.float32).reshape(-1, 1)
    data = open_dataset(da.from_array(X, chunks=(100, 1)))
    out = Engine(client).scan(data, _prepare_rows, _fold_append, {"h": 0.0, "n": 0})
    expect = 0.0
    for c in range(6):
        expect = expect * 1.0001 + X[c * 100:(c + 1) * 100, 0].astype(np.float64).sum()
    assert out["n"] == 600 and out["h"] == pytest.approx(expect, rel=1e-12)


def _prepare_rows_seen(payload, X, y, start=0):
    return {"v": X[:, 0].astype(np.float64), "start": start}


def _fold_pieces(state, prepared, payload):
    assert prepared["start"] == state["n"]  # pass_start counts the rows before the piece
    h = state["h"]
    for v in prepared["v"]:  # row by row: the same rows in the same order, the same h
        h = h * 1.0001 + v
    return {"h": h, "n": state["n"] + prepared["v"].size,
            "largest": max(state["largest"], prepared["v"].size)}


def test_scan_cuts_large_chunks_into_pieces_and_folds_them_in_order(client, tmp_path,
                                                                   monkeypatch):
    # a prepared chunk can be many times the chunk (Oja's: 12 kB a row): max_rows
    # bounds a task's rows, and the fold sees the same rows in the same order
    from dkernel.data.store import write_store
    from dkernel.engine.checkpoint import Checkpointer

    X = np.arange(600, dtype=np.float32).reshape(-1, 1)
    data = open_dataset(str(write_store(tmp_path / "rows.zarr", X, chunk_rows=100)))
    state = {"h": 0.0, "n": 0, "largest": 0}
    kw = dict(n_epochs=2, pass_start=True)
    whole = Engine(client).scan(data, _prepare_rows_seen, _fold_pieces, state, **kw)
    ckpt = tmp_path / "scan.ckpt.npz"
    saved = []
    save = Checkpointer.save
    monkeypatch.setattr(Checkpointer, "save", lambda self, st, step: (saved.append(step),
                                                                      save(self, st, step)))
    with get_task_stream(client) as ts:
        cut = Engine(client, EngineOptions(checkpoint=str(ckpt), checkpoint_every=3)).scan(
            data, _prepare_rows_seen, _fold_pieces, state, max_rows=32, **kw)
    assert whole["largest"] == 100 and cut["largest"] == 32
    # a chunk is read once for its pieces (each piece read it: 4 reads a chunk)
    assert sum(str(t["key"]).startswith(f"read-{data.X.name}-") for t in ts.data) == 12
    # checkpoint_every counts chunks, as before pieces: 12 chunks, every 3rd (not
    # every 3rd of the 48 pieces, each a wait for the state)
    assert saved == [12, 24, 36, 48]
    assert cut["n"] == whole["n"] == 1200 and cut["h"] == whole["h"]
    # a checkpoint counts pieces: a scan that would count chunks refuses it
    with pytest.raises(ValueError, match="differs in: piece_rows"):
        Engine(client, EngineOptions(checkpoint=str(ckpt), resume=True)).scan(
            data, _prepare_rows_seen, _fold_pieces, state, **kw)
    again = Engine(client, EngineOptions(checkpoint=str(ckpt), resume=True)).scan(
        data, _prepare_rows_seen, _fold_pieces, state, max_rows=32, **kw)
    assert again["h"] == cut["h"]


def _prepare_where(payload, X, y):
    # a prepared chunk as Oja's: rows and a list of per-block products
    Z = np.repeat(X, 64, axis=1)
    return {"Z": Z, "G": [Z[:8] @ Z[:8].T], "where": get_worker().address}


def _fold_offsets(state, prepared, payload):
    here = get_worker().address
    offsets = [a.ctypes.data % 16 for a in (prepared["Z"], prepared["G"][0], state["pad"])]
    travelled = [prepared["where"] != here, state["where"] not in ("", here)]
    return {"pad": state["pad"], "where": here, "log": state["log"] + [(offsets, travelled)]}


@pytest.mark.parametrize("pad", [1, 300_000], ids=["the-state-travels", "the-chunks-travel"])
def test_scan_folds_get_aligned_arrays_wherever_they_run(client, pad):
    # A fold runs where the scheduler puts it: beside its prepared chunk (the
    # state then comes from the previous fold's worker) or, with a state larger
    # than a chunk, beside the state (the chunk then comes over).  Either way
    # arrays arrive at any byte offset (seen: 14 for the state, 8 for a chunk),
    # and a product on one off its itemsize rounds differently (backend.aligned):
    # StreamingKernelPCA gave two 2-worker fits 3e-8 apart.
    X = np.random.default_rng(0).standard_normal((1200, 1)).astype(np.float32)
    data = open_dataset(da.from_array(X, chunks=(100, 1)))
    state = {"pad": np.zeros(pad), "where": "", "log": []}
    log = Engine(client).scan(data, _prepare_where, _fold_offsets, state)["log"]
    assert any(any(travelled) for _, travelled in log), "nothing travelled: no test"
    assert [offsets for offsets, _ in log] == [[0, 0, 0]] * 12


def test_same_seed_gives_bit_identical_model_on_one_or_two_workers(client):
    X, y = make_blobs_classification(1200, 6)
    Xd, yd = da.from_array(X, chunks=(300, 6)), da.from_array(y, chunks=300)
    # lanes given: the width is what the model depends on ("auto" follows the cluster)
    kw = dict(n_features=512, block_size=128, n_epochs=2, batch_size=128, bandwidth=2.0,
              random_state=5, lanes=4)
    two = DSGClassifier(client=client, **kw).fit(Xd, yd)
    with LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as one_client:
        one = DSGClassifier(client=one_client, **kw).fit(Xd, yd)
    assert np.array_equal(one.coef_, two.coef_)


def test_nan_in_a_stored_chunk_is_reported_with_its_row_during_the_first_pass(client, tmp_path):
    from dkernel.data import write_store

    X, y = make_blobs_classification(800, 4)
    X[613, 2] = np.nan
    path = write_store(tmp_path / "bad.zarr", X, y, chunk_rows=200)
    with pytest.raises(ValueError, match=r"NaN or infinity.*first bad row: 613"):
        DSGClassifier(n_features=256, n_epochs=1, bandwidth=1.0, client=client).fit(path)


def test_checkpoint_from_other_settings_is_refused_by_name(client, tmp_path):
    X, y = make_blobs_classification(400, 4)
    ck = str(tmp_path / "ck.npz")
    kw = dict(n_features=256, n_epochs=1, batch_size=64, bandwidth=1.0, client=client,
              checkpoint=ck, checkpoint_every=1)
    DSGClassifier(**kw).fit(X, y)
    with pytest.raises(ValueError, match="differs in: .*batch_size"):
        DSGClassifier(**{**kw, "batch_size": 32, "resume": True}).fit(X, y)


def test_engine_options_default_lanes_bounded_by_chunks(client):
    data = open_dataset(np.ones((10, 2), np.float32), chunk_rows=5)
    plan = Engine(client, EngineOptions(lanes=8)).plan(data, 4, 0)
    assert plan.lanes == 2


def _cache_stats():
    from dkernel.engine import cache

    return cache.stats()


def _set_cache_fraction(value):
    import dask

    from dkernel.engine import cache

    cache.clear()
    dask.config.set({"dkernel.cache-fraction": value})


def test_worker_cache_serves_later_epochs_and_streaming_gives_the_same_model(client):
    X, y = make_blobs_classification(1600, 6)
    Xd, yd = da.from_array(X, chunks=(400, 6)), da.from_array(y, chunks=400)
    kw = dict(n_features=512, block_size=128, n_epochs=3, batch_size=128, bandwidth=2.0,
              client=client)
    try:
        client.run(_set_cache_fraction, 0.4)
        cached = DSGClassifier(**kw).fit(Xd, yd)
        stats = client.run(_cache_stats).values()
        # 4 chunks x 4 blocks are computed once; every later use is a hit
        assert sum(s["misses"] for s in stats) <= 16 + 4
        assert sum(s["hits"] for s in stats) > 10 * sum(s["misses"] for s in stats)
        assert cached.feature_cache_ == "float32"
        client.run(_set_cache_fraction, 0.0)  # nothing fits: regenerate rows from seeds
        streamed = DSGClassifier(**kw).fit(Xd, yd)
        assert streamed.feature_cache_ == "off"  # "auto" saw that nothing fits
        # "float32" as given asks the cache for every block; it declines them all
        declined = DSGClassifier(feature_cache="float32", **kw).fit(Xd, yd)
        assert sum(s["declined"] for s in client.run(_cache_stats).values()) > 0
    finally:
        client.run(_set_cache_fraction, 0.4)
    np.testing.assert_allclose(streamed.coef_, cached.coef_, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(declined.coef_, cached.coef_, rtol=1e-4, atol=1e-6)


def test_losing_a_worker_mid_fit_redoes_the_step_and_gives_the_same_model():
    import os
    import signal

    from dkernel.features import FeatureMap
    from dkernel.solvers.dsg import DSGProgram
    from dkernel.solvers.targets import TargetEncoding

    X, y = make_blobs_classification(2000, 6)
    data = open_dataset(X, y, chunk_rows=250)  # in memory: chunks are scattered, not recomputable
    program = DSGProgram(FeatureMap("gaussian", 2.0, 6, 128, 1), "softmax",
                         TargetEncoding("onehot", classes=(0, 1, 2)), 4, 1e-6, 10.0, 1e-3)
    kw = dict(n_epochs=3, batch_size=64, random_state=1)
    with LocalCluster(n_workers=3, threads_per_worker=1, dashboard_address=":0",
                      silence_logs=logging.CRITICAL) as cluster, Client(cluster) as c:
        reference = Engine(c).run_steps(data, program, **kw)
        killed = []

        def kill_one_worker(state, epoch):
            if epoch == 0:
                pid = next(iter(c.run(os.getpid).values()))
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)

        state = Engine(c).run_steps(data, program, on_epoch=kill_one_worker, **kw)
    assert killed
    assert np.array_equal(state["coef"], reference["coef"]) and state["scale"] == reference["scale"]


def _sum_and_gram(payload, X, y):
    X = X.astype(np.float64)  # exact products: the test checks the sum, not float32 rounding
    return {"S": X.sum(axis=0), "A": X.T @ X, "count": X.shape[0]}


def test_map_reduce_memory_does_not_grow_with_the_number_of_chunks(client, tmp_path):
    # 200 chunks, each partial a 64 x 64 Gram: the old pass kept all 200 alive
    # and pulled each to the client; now at most window + log2(n) + 1 are alive
    import math

    from dkernel.data.store import write_store

    rng = np.random.default_rng(0)
    X = rng.standard_normal((200 * 25, 64)).astype(np.float32)
    path = write_store(tmp_path / "many.zarr", X, chunk_rows=25)
    data = open_dataset(str(path))
    assert data.n_chunks == 200
    engine = Engine(client)
    total = engine.map_reduce(data, _sum_and_gram, window=4)
    X64 = X.astype(np.float64)
    np.testing.assert_allclose(total["A"], X64.T @ X64, rtol=1e-10, atol=1e-8)
    np.testing.assert_allclose(total["S"], X64.sum(axis=0), rtol=1e-10, atol=1e-8)
    assert total["count"] == X.shape[0]
    assert engine.peak_live <= 4 + math.ceil(math.log2(200)) + 1
    # the pairing depends on the chunk count alone: the same bits on a rerun
    again = Engine(client).map_reduce(data, _sum_and_gram, window=7)
    assert np.array_equal(again["A"], total["A"])


def _count_rows(payload, X, y):
    return {"count": X.shape[0]}


class _Idle(StepProgram):
    """Steps that count rows and change nothing: the engine's loop alone."""

    partial = staticmethod(_count_rows)
    label = "idle"

    def init_state(self):
        return {"x": np.zeros(1)}

    def payload(self, state, step):
        return {}

    def update(self, state, total, step):
        return state


def test_the_clients_blas_runs_on_one_thread_during_steps_and_is_restored_after(client):
    # OpenBLAS helper threads spin after each threaded call on the client, on the
    # cores the workers compute on (docs/design.md §5): the step loop keeps BLAS on one thread
    from threadpoolctl import threadpool_info

    def blas_threads():
        return [lib["num_threads"] for lib in threadpool_info() if lib["user_api"] == "blas"]

    seen = []

    class Record(_Idle):
        label = "record"

        def update(self, state, total, step):
            np.ones((64, 64)) @ np.ones((64, 64))  # a BLAS call on the client
            seen.extend(blas_threads())
            return state

    before = blas_threads()
    data = open_dataset(np.zeros((400, 2), np.float32), chunk_rows=100)
    Engine(client).run_steps(data, Record(), n_epochs=1, batch_size=100, random_state=0)
    assert seen and set(seen) == {1}
    assert blas_threads() == before


#: How much longer a lane on a chunk of ones computes.  The other lane takes
#: well under a millisecond; on a loaded machine a thread can wait tens of
#: milliseconds for a core, so the gap is made far larger than that.
_SLOW_SECONDS = 0.4


def _slow_on_ones(payload, X, y):
    if X.shape[0] and X[0, 0] == 1.0:
        time.sleep(_SLOW_SECONDS)
    return {"count": X.shape[0]}


def test_each_epoch_names_the_worker_whose_lane_made_the_others_wait(client, caplog):
    # chunks 0 and 2 hold ones; every step takes one of them and one of chunks 1
    # and 3 (a group takes one chunk of each lane class c % 2)
    class SlowLane(_Idle):
        partial = staticmethod(_slow_on_ones)
        label = "slow lane"

    X = np.zeros((800, 2), np.float32)
    X[0:200] = X[400:600] = 1.0
    data = open_dataset(X, chunk_rows=200)
    engine = Engine(client, EngineOptions(lanes=2))
    with caplog.at_level("INFO", logger="dkernel.engine"), get_task_stream(client) as stream:
        engine.run_steps(data, SlowLane(), n_epochs=1, batch_size=200, random_state=0)
    entry = engine.history[0]
    assert entry["steps"] == 4
    # each step's other lane waited the sleep less the lanes' mean of it, half the
    # sleep: 4 x 0.2 s; half of that is left to the fast lane's scheduling noise
    assert 4 * _SLOW_SECONDS / 4 < entry["straggler_seconds"] < entry["seconds"]
    # the worker that ran the ones chunks' steps: their home (chunk c on
    # sorted(workers)[c % 2]) unless the scheduler moved a task off it, which a
    # loaded machine makes likelier, so the count comes from the task stream
    slow = [t["worker"] for t in stream.data
            if re.fullmatch(r"slow-lane-step-\w+-\d+-[02]-\d+", str(t["key"]))]
    assert len(slow) == 4
    line = next(r.getMessage() for r in caplog.records if "slowest lane" in r.getMessage())
    named, count = re.search(r"most often (\S+): (\d+) of 4 steps", line).groups()
    assert int(count) == slow.count(named) == max(slow.count(w) for w in slow)


def test_many_lanes_are_summed_eight_at_a_time_on_the_workers_in_a_fixed_order(client):
    # 20 partials: groups of 8, 8 and 4 summed by 3 tasks, then by the client.  A
    # pairwise tree took 19 tasks in 5 levels, each task ~1.5 ms of the scheduler.
    rng = np.random.default_rng(0)
    parts = [{"g": rng.standard_normal(257).astype(np.float32),
              "_slowest": (float(7 * i % 20), f"w{i}")} for i in range(20)]
    futs = client.scatter(parts)

    def ran():
        return sum(client.run(lambda dask_worker: dask_worker.state.executed_count).values())

    before = ran()
    total = tree_sum(client, futs)
    assert ran() - before == 3
    groups = [parts[i:i + 8] for i in range(0, 20, 8)]
    sums = []
    for g in groups:
        s = g[0]["g"]
        for p in g[1:]:
            s = s + p["g"]
        sums.append(s)
    assert np.array_equal(total["g"], sums[0] + sums[1] + sums[2])
    assert total["_slowest"] == (19.0, "w17")
    # the same grouping on every call, so the same floating-point sum
    assert np.array_equal(tree_sum(client, client.scatter(parts))["g"], total["g"])


def test_thread_slots_deal_each_worker_one_lane_class_per_thread():
    assert thread_slots({"b": 3, "a": 1}) == ["a", "b", "b", "b"]
    assert thread_slots({"a": 2, "b": 2}) == ["a", "b", "a", "b"]
    assert thread_slots({}) == []


@pytest.fixture(scope="module")
def two_threads():
    """One worker process with two threads, as ``dask worker`` starts on a 2-core host."""
    with LocalCluster(n_workers=1, threads_per_worker=2, dashboard_address=":0",
                      silence_logs=logging.ERROR) as cluster, Client(cluster) as c:
        yield c


def test_auto_lanes_follow_worker_threads_so_a_two_thread_worker_runs_two_lanes(client,
                                                                                two_threads):
    # Dask runs one task per worker thread: one lane per worker left a
    # multi-threaded worker's other threads idle (dask worker's default
    # --nthreads is the machine's cores)
    X, y = make_blobs_classification(1200, 6)
    Xd, yd = da.from_array(X, chunks=(300, 6)), da.from_array(y, chunks=300)
    kw = dict(n_features=512, block_size=128, n_epochs=1, batch_size=128, bandwidth=2.0,
              random_state=5)
    with get_task_stream(two_threads) as stream:
        auto = DSGClassifier(client=two_threads, **kw).fit(Xd, yd)
    assert auto.lanes_ == 2
    steps = [t for t in stream.data if "-step-" in str(t["key"])]
    assert len({t["thread"] for t in steps}) == 2
    # the model is the one two single-threaded workers fit with the same lanes
    fixed = DSGClassifier(client=client, lanes=2, **kw).fit(Xd, yd)
    assert np.array_equal(auto.coef_, fixed.coef_)


@pytest.mark.parametrize("make", [
    # kernel form, every row a center: kernel rows filled and kept on the chunks' homes
    lambda **kw: EigenProRegressor(bandwidth=0.5, n_epochs=2, kernel_cache="fixed16", **kw),
    lambda **kw: EigenProRegressor(n_features=256, n_epochs=2, **kw),
], ids=["eigenpro-kernel", "eigenpro-rf"])
def test_multithreaded_workers_fit_the_model_single_threaded_workers_fit(client, two_threads,
                                                                           tmp_path, make):
    from dkernel.data import write_store

    rng = np.random.default_rng(3)
    X = rng.uniform(-1, 1, (900, 3))
    y = np.sin(2 * X[:, 0]) + X[:, 1]
    store = write_store(tmp_path / "s.zarr", X, y, chunk_rows=200)  # 5 chunks
    auto = make(client=two_threads).fit(store)
    assert auto.lanes_ == 2
    fixed = make(client=client, lanes=2).fit(store)
    # bit for bit: every sum's order follows the lanes and chunks, not the cluster
    assert np.array_equal(auto.coef_, fixed.coef_)


def _line_fit(payload, X, y):
    """Least squares of y on the one column x: the gradient and the loss at w."""
    r = X[:, 0] * payload["w"] - y
    return {"grad": float(X[:, 0] @ r), "loss": float(r @ r), "count": X.shape[0]}


class _Line(StepProgram):
    """Gradient descent on (1/m)|x w - y|^2 with x = +-1: the curvature is 1 in
    every mini-batch, so a step eta multiplies the error w - w* by 1 - eta."""

    partial = staticmethod(_line_fit)
    label = "line"
    supports_backoff = True

    def __init__(self, eta):
        self.eta = eta

    def init_state(self):
        return {"w": 0.0}

    def payload(self, state, step):
        return {"w": state["w"]}

    def update(self, state, total, step):
        eta = self.eta * state.get("step_scale", 1.0)
        return {**state, "w": state["w"] - eta * total["grad"] / total["count"]}


def _line_data(y_of_x):
    x = np.resize([1.0, -1.0], 600).astype(np.float32)
    return open_dataset(x[:, None], y_of_x(x), chunk_rows=200)


def test_an_epoch_that_ends_above_its_start_is_replayed_with_half_the_step(client):
    # eta = 2.2 overshoots: the error goes 1, -1.2, 1.44 (loss x1.44 a step), so
    # the three steps' losses read 1, 1.44, 2.07 -- never 4x the start, which is
    # all the step-level guard looks for; the fit ended at loss 2.99 with only a
    # FitQualityWarning.  Replayed at eta 1.1 the error goes 1, 0.1, 0.01.
    import warnings

    from dkernel import FitQualityWarning

    engine = Engine(client, EngineOptions(lanes=1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", FitQualityWarning)
        state = engine.run_steps(_line_data(lambda x: x), _Line(2.2), n_epochs=1, batch_size=200,
                                 random_state=0)
    assert abs(state["w"] - 1.0) < 1e-2 and state["step_scale"] == 0.5
    (backoff,) = engine.backoffs
    # judged by the worse of the steps' mean ((1.44 + 2.07) / 2) and the end state's
    # own loss, probed after the last epoch: 1.2^6 = 2.99
    assert backoff["epoch"] == 1 and backoff["loss"] == pytest.approx(1.2**6)
    assert engine.history[0]["step_backoffs"] == 1 and engine.history[0]["step_scale"] == 0.5
    assert engine.history[0]["steps"] == 3  # the accepted attempt's


class _Still:
    label, supports_backoff = "still", True

    def divergence_hint(self):
        return "use a smaller step_size"


def test_two_row_batches_are_pooled_before_the_guard_calls_them_diverged():
    # A fit that cannot move (step_size=1e-6) on 2-row batches: its batch
    # losses are chi^2_2 / 2 draws around the true loss, and one in 55 is past
    # 4x -- EigenProRegressor(alpha=1.0) stopped with DivergenceError at step 18.
    from dkernel.engine.guard import POOL_ROWS, DivergenceGuard

    rng = np.random.default_rng(0)
    guard = DivergenceGuard(_Still(), batch_size=2)
    state = guard.start({"w": np.zeros(1)})
    for step, loss in enumerate(rng.chisquare(2, 3000) / 2):
        assert guard.before_update(state, {"loss": 2 * loss, "count": 2}, step) is None
    assert not guard.backoffs and state["guard_reference_rows"] >= POOL_ROWS
    # a checkpoint keeps the pool: a resumed fit judges its next steps alike
    again = DivergenceGuard(_Still(), batch_size=2)
    again.resume(guard.checkpoint_state(state))
    assert again.pool == guard.pool and sum(r for _, r in again.pool) >= POOL_ROWS
    # a real blow-up still stops within a pool of rows
    for step in range(3000, 3000 + POOL_ROWS):
        restored = guard.before_update(state, {"loss": 2 * 10.0 ** (step - 2990), "count": 2}, step)
        if restored is not None:
            break
    assert guard.backoffs and step < 3000 + 20
    # with a batch of POOL_ROWS rows or more every step is judged alone, as
    # before pooling -- also a plan's short step (a group one chunk short)
    big = DivergenceGuard(_Still(), batch_size=512)
    state = big.start({"w": np.zeros(1)})
    assert big.before_update(state, {"loss": 1.0 * 512, "count": 512}, 0) is None
    assert big.before_update(state, {"loss": 1.0 * 512, "count": 512}, 1) is None
    assert big.before_update(state, {"loss": 4.1 * 128, "count": 128}, 2) is not None
    assert state["guard_reference_rows"] == 512


def test_a_large_alpha_with_its_tiny_automatic_batch_fits_instead_of_diverging(client):
    # alpha=1 made EigenPro's critical batch 3 rows: the guard's 4x test on
    # single batches raised DivergenceError; kernel ridge scores R^2 0.13 here
    from dkernel import EigenProRegressor

    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    with warnings.catch_warnings():
        # nor is it called no better than the mean: its start and end are
        # measured on the same PROBE_ROWS rows (it warned from ~32 rows each)
        warnings.simplefilter("error", FitQualityWarning)
        m = EigenProRegressor(alpha=1.0, bandwidth=1.0, n_epochs=2, client=client).fit(X, y)
    assert m.batch_size_ <= 3 and m.step_backoffs_ == [] and m.score(X, y) > 0.1


@pytest.mark.parametrize("batch_size", [2, "auto"])
def test_a_fit_that_barely_moved_is_called_no_better_than_its_start(client, batch_size):
    # DSG at step_size=0.05 ended at training R^2 0.0002 with no warning: the
    # end state had to be above the start to warn; on the same rows it must
    # now be 1% below it
    rng = np.random.default_rng(0)
    X = rng.normal(size=(2000, 3))
    y = np.sin(X[:, 0]) + 0.5 * X[:, 1]
    with pytest.warns(FitQualityWarning, match="no better than the starting model's .* to 1%"):
        m = DSGRegressor(n_features=256, step_size=1e-6, batch_size=batch_size, n_epochs=1,
                         client=client).fit(X, y)
    assert m.score(X, y) < 0.01


class _Drift(_Line):
    """Steps that move w away from w* = 1 by 0.45 x the step scale, whatever
    the gradient: no step is small enough to help."""

    def update(self, state, total, step):
        return {**state, "w": state["w"] - 0.45 * state.get("step_scale", 1.0)}


def test_an_epoch_that_no_smaller_step_brings_below_its_start_keeps_the_lowest_loss_seen(client):
    # Steps 1 and 2 read (1 + 0.45 s)^2 and (1 + 0.9 s)^2 at scale s: a mean of
    # 2.86, 1.80, 1.37, 1.18 for s = 1 .. 1/8, every one above the start (1) by
    # more than the margin (0.116 at 2000 + 4000 rows).  After three replays the
    # epoch keeps its starting state (the lowest loss seen) and the next epoch,
    # with no replays left, too; the fit warns, as a fit of an unlearnable target
    # must, and does not raise or loop.
    from dkernel import FitQualityWarning
    from dkernel.engine.guard import end_margin

    assert end_margin(2000, 4000) == pytest.approx(3 * np.sqrt(2 / 2000 + 2 / 4000))
    engine = Engine(client, EngineOptions(lanes=1))
    x = np.resize([1.0, -1.0], 6000).astype(np.float32)
    data = open_dataset(x[:, None], x, chunk_rows=2000)
    with pytest.warns(FitQualityWarning, match="every update was undone"):
        state = engine.run_steps(data, _Drift(1.0), n_epochs=2, batch_size=2000, random_state=0)
    assert state["w"] == 0.0 and state["step_scale"] == 1 / 8
    assert [b["step_scale"] for b in engine.backoffs] == [0.5, 0.25, 0.125]
    assert [h["step_backoffs"] for h in engine.history] == [3, 0]


class _Crash(_Line):
    """_Line that dies at its ``at``-th update, as a coordinator might."""

    def __init__(self, eta, at):
        super().__init__(eta)
        self.at, self.updates = at, 0

    def update(self, state, total, step):
        self.updates += 1
        if self.updates == self.at:
            raise RuntimeError("coordinator lost")
        return super().update(state, total, step)


@pytest.mark.parametrize("at", [2, 5, 8])
def test_a_fit_killed_before_or_during_a_replayed_epoch_resumes_to_the_same_model(client, tmp_path,
                                                                                 at):
    # updates 1-3 are the first try of epoch 1 (replayed), 4-6 its replay, 7-9
    # epoch 2; a checkpoint every step: the resumed fit must know the epoch's
    # starting state and what its first steps measured to judge it as the
    # uninterrupted fit did
    data = _line_data(lambda x: x)
    run = dict(n_epochs=2, batch_size=200, random_state=0)
    whole = Engine(client, EngineOptions(lanes=1)).run_steps(data, _Line(2.2), **run)
    opts = EngineOptions(lanes=1, checkpoint=str(tmp_path / "ck.npz"), checkpoint_every=1)
    with pytest.raises(RuntimeError, match="coordinator lost"):
        Engine(client, opts).run_steps(data, _Crash(2.2, at), **run)
    opts.resume = True
    resumed = Engine(client, opts).run_steps(data, _Line(2.2), **run)
    assert resumed["w"] == whole["w"] and resumed["step_scale"] == whole["step_scale"] == 0.5


def test_small_chunks_are_bundled_per_lane_class_and_never_across():
    """A lane reads k = round(slice / chunk) small chunks of its own class as one
    (data.plan.chunk_bundles); chunks near a lane's slice are left alone."""
    from dkernel.data.plan import chunk_bundles

    bundles = chunk_bundles(tuple([500] * 37), 2, 8192)  # slice 4096: k = 8
    assert bundles is not None
    assert sorted(c for b in bundles for c in b) == list(range(37))
    for i, b in enumerate(bundles):
        assert len(b) <= 8 and all(c % 2 == i % 2 for c in b)  # bundle i: lane class i mod 2
    assert [len(b) for b in bundles[:2]] == [8, 8]
    assert chunk_bundles(tuple([4000] * 10), 2, 8192) is None  # k = 1
    assert chunk_bundles(tuple([500] * 37), 2, 8192) == bundles  # a pure function


def test_a_fit_on_small_chunks_takes_the_steps_its_batch_asks_for(client):
    """DSG on 500-row chunks (and on in-memory X) takes as many steps an epoch
    as on 4000-row chunks (its lanes read bundles of 8), not one 500-row slice a lane a step, and
    the fit is reproducible; its cached blocks are keyed by the member chunks."""
    from dkernel.engine.chunks import _BundleSource, _ChunkSource

    X, y = make_dai_ridge(16000, 6, random_state=3)
    kw = dict(n_features=256, block_size=128, n_epochs=1, batch_size=8192, bandwidth=2.0,
              client=client, lanes=2)
    small = [DSGRegressor(**kw).fit(da.from_array(X, chunks=(500, 6)),
                                    da.from_array(y, chunks=500)) for _ in range(2)]
    wide = DSGRegressor(**kw).fit(da.from_array(X, chunks=(4000, 6)),
                                  da.from_array(y, chunks=4000))
    assert small[0].history_[0]["steps"] == wide.history_[0]["steps"] == 2
    np.testing.assert_array_equal(small[0].coef_, small[1].coef_)
    # in-memory X is cut into small chunks too (data.dataset.as_dask_rows: 8 of
    # 2000 rows here); its lanes bundle them alike, or batch_size_ would report
    # 8192 rows for steps of 4000
    host = DSGRegressor(**kw).fit(X, y)
    assert host.batch_size_ == 8192 and host.history_[0]["steps"] == 2
    source = _BundleSource(_ChunkSource(client, open_dataset(X, y, chunk_rows=500), "float32"),
                           [(0, 2), (1, 3)])
    assert source.key("X", 0) == ("X", ("bundle", 0, 2)) != ("X", 0)


def test_rows_are_reshuffled_inside_every_chunk_each_epoch():
    # rows are reshuffled inside each chunk every epoch: the older test's
    # 'order changes' held by the chunk order alone
    from dkernel.data.plan import ChunkPlan

    plan = ChunkPlan((100, 100, 100, 37), batch_size=64, lanes=2, random_state=3)
    for c in range(4):
        assert not np.array_equal(np.concatenate(plan.row_slices(0, c)),
                                  np.concatenate(plan.row_slices(1, c))), c
