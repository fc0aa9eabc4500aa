"""Old import path of the Parquet and parallel CSV readers, kept so that
``dkernel.data.tabular`` imports still work; the code is
:mod:`dkernel.data.ingest.parquet` and :mod:`dkernel.data.ingest.csv`."""

from dkernel.data.ingest.csv import ingest_csv_parallel
from dkernel.data.ingest.parquet import ingest_parquet

__all__ = ["ingest_parquet", "ingest_csv_parallel"]
