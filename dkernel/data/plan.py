"""Which rows go into which step: chunk-level shuffling for out-of-core data.

Each epoch the chunk order is permuted and chunks are taken ``lanes`` at a
time (a group, loaded once), one from each lane class c mod ``lanes``; the
rows of every chunk are permuted and cut into slices of
``ceil(batch_size / lanes)``, a remainder shorter than half a slice joining
the last slice (a step of a few rows would cost a whole round trip: Fashion-MNIST's
8192-row chunks at EigenPro's batch of 4093 ended every group with a 4-row
step, 4 steps of 20 an epoch).  Step j of a group takes slice j of every chunk
in the group, so one mini-batch is spread over ``lanes`` chunks.  The engine
keeps chunk c on worker c mod n_workers, so when the worker count divides
the lanes (or the lanes divide it) a group's chunks sit on different workers
and a step is never two tasks queued on one worker while another idles.  The
plan depends on the seed, the epoch, the batch size, the lanes and the row
chunking -- never on the number of workers -- which makes fits reproducible
on any cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache

import numpy as np


def _rng(*key: int) -> np.random.Generator:
    return np.random.Generator(np.random.Philox(np.random.SeedSequence([int(k) for k in key])))


# Domain separators so chunk-order and row-order streams never collide with
# each other or with feature seeds.
_ORDER, _ROWS = 0x0D3, 0x120


@dataclass(frozen=True)
class ChunkPlan:
    """The steps of a fit over chunks of ``row_chunks`` rows: ``batch_size`` rows
    a step, spread over ``lanes`` chunks, in an order drawn from ``random_state``
    (``shuffle=False``: chunks and rows in storage order)."""

    #: Changes whenever a plan's rows per step change; part of a checkpoint's
    #: fingerprint, so a checkpoint of an older plan is refused, not replayed
    #: on different rows.  (3: in-memory X's small chunks bundled, stop 39.)
    VERSION = 3

    row_chunks: tuple[int, ...]
    batch_size: int
    lanes: int
    random_state: int
    shuffle: bool = True

    def chunk_order(self, epoch: int) -> np.ndarray:
        n = len(self.row_chunks)
        if not self.shuffle:
            return np.arange(n)
        return _rng(_ORDER, self.random_state, epoch).permutation(n)

    def groups(self, epoch: int) -> list[tuple[int, ...]]:
        """The epoch's groups: the i-th takes the i-th chunk of every lane class
        in the permuted order (a class may run one chunk short at the end)."""
        order = [int(c) for c in self.chunk_order(epoch)]
        classes = [[c for c in order if c % self.lanes == r] for r in range(self.lanes)]
        return [tuple(cl[i] for cl in classes if i < len(cl))
                for i in range(max(len(cl) for cl in classes))]

    @property
    def per_lane(self) -> int:
        return max(1, math.ceil(self.batch_size / self.lanes))

    def n_slices(self, chunk: int) -> int:
        """Slices of ``per_lane`` rows, a remainder under half a slice merged."""
        return max(1, int(self.row_chunks[chunk] / self.per_lane + 0.5))

    def group_steps(self, group: tuple[int, ...]) -> int:
        return max(self.n_slices(c) for c in group)

    def steps_per_epoch(self, epoch: int) -> int:
        return sum(self.group_steps(g) for g in self.groups(epoch))

    def row_slices(self, epoch: int, chunk: int) -> list[np.ndarray]:
        return [self.row_slice(epoch, chunk, i).rows() for i in range(self.n_slices(chunk))]

    def row_slice(self, epoch: int, chunk: int, index: int) -> RowSlice:
        """Slice ``index`` of a chunk's rows as a few integers that the worker
        expands (:meth:`RowSlice.rows`): the client never builds the row
        permutations, and a step ships no index arrays (a lane's 65536 rows
        were 512 KB a task, 0.5 GB a step at 1000 lanes)."""
        return RowSlice(self.row_chunks[chunk], self.per_lane, self.n_slices(chunk),
                        self.random_state, epoch, chunk, index, self.shuffle)


def chunk_bundles(row_chunks: tuple[int, ...], lanes: int,
                  batch_size: int) -> list[tuple[int, ...]] | None:
    """Chunks a lane reads as one, when the store's chunks are much smaller than a
    lane's share of a step; None when they are not.

    A step spreads ``batch_size`` rows over ``lanes`` chunks, one slice of
    ``ceil(batch_size / lanes)`` rows from each, so a chunk smaller than that
    slice shrinks the step to ``lanes`` x its rows: on 10k-row chunks DSG's
    65536-row lanes became 10k-row ones, six times the steps and their fixed
    cost (23% of the compute ceiling against 65-70% on 100k-row chunks, issue
    30).  A bundle is k = round(slice / median chunk) chunks of one lane class
    (c mod ``lanes``: they share a home worker), consecutive in storage order;
    bundle b holds chunks of class b mod ``lanes``, so a plan over bundles keeps
    the lanes' homes.  It depends only on the chunking, the lanes and the
    batch -- never on the cluster -- as the plan does."""
    per_lane = max(1, math.ceil(int(batch_size) / int(lanes)))
    k = int(round(per_lane / max(1.0, float(np.median(row_chunks)))))
    if k < 2:
        return None
    classes = [list(range(r, len(row_chunks), lanes)) for r in range(lanes)]
    per_class = [[tuple(cl[i:i + k]) for i in range(0, len(cl), k)] for cl in classes]
    return [per_class[b % lanes][b // lanes]
            for b in range(max(len(p) for p in per_class) * lanes)
            if b // lanes < len(per_class[b % lanes])]


@dataclass(frozen=True)
class RowSlice:
    """Rows ``index`` of a chunk of ``n`` rows cut in ``n_slices`` slices of
    ``per_lane`` (the last takes the rest), after the chunk's seeded permutation."""

    n: int
    per_lane: int
    n_slices: int
    random_state: int
    epoch: int
    chunk: int
    index: int
    shuffle: bool = True

    def rows(self) -> np.ndarray:
        order = _order(self.n, self.random_state, self.epoch, self.chunk, self.shuffle)
        w, last = self.per_lane, self.index == self.n_slices - 1
        return order[self.index * w : self.n if last else (self.index + 1) * w]

    def __len__(self) -> int:
        return (self.n - self.index * self.per_lane if self.index == self.n_slices - 1
                else self.per_lane)


@lru_cache(maxsize=16)
def _order(n: int, random_state: int, epoch: int, chunk: int, shuffle: bool) -> np.ndarray:
    """A chunk's row order in an epoch; cached because a lane takes the slices of
    one chunk step after step (a 65536-row permutation costs ~0.6 ms here)."""
    rows = _rng(_ROWS, random_state, epoch, chunk).permutation(n) if shuffle else np.arange(n)
    rows.flags.writeable = False
    return rows
