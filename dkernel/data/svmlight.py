"""Old import path of the libsvm reader, kept so that ``dkernel.data.svmlight``
imports still work; the code is :mod:`dkernel.data.ingest.libsvm`."""

from dkernel.data.ingest.libsvm import (
    byte_ranges,
    dense_range,
    ingest_libsvm_parallel,
    read_range,
    scan_range,
    width,
)

__all__ = ["byte_ranges", "dense_range", "ingest_libsvm_parallel", "read_range", "scan_range",
           "width"]
