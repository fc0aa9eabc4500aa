"""Opening, validating and ingesting datasets; chunk plans and shuffling order.

A dataset is a row-chunked dask array ``X`` (n x d) and an optional ``y``
(n or n x c) with the same row chunks, opened from NumPy, dask, or a zarr
store given by path or fsspec URL.
"""

from dkernel.data.dataset import Dataset, as_dask_rows, open_dataset
from dkernel.data.plan import ChunkPlan
from dkernel.data.store import write_store
from dkernel.data.validate import check_finite_chunk

__all__ = ["Dataset", "open_dataset", "as_dask_rows", "ChunkPlan", "check_finite_chunk",
           "write_store"]
