"""A Parquet file streamed from pieces has the bytes of the same rows written as one table, however they were cut."""
from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from manifests.atomic import PARQUET_OPTIONS, atomic_write_parquet, atomic_write_parquet_stream

SCHEMA = pa.schema([("id", pa.string()), ("n", pa.int64())])
GROUP = PARQUET_OPTIONS["row_group_size"]


@pytest.mark.parametrize("total, cuts", [(0, []), (5, [2]), (GROUP, []), (2 * GROUP + 7, [1, GROUP - 1, GROUP, GROUP + 3])])
def test_streamed_pieces_give_the_one_table_bytes(tmp_path, total, cuts):
    rng = np.random.default_rng(total)
    table = pa.table({"id": [f"d{i}" for i in rng.integers(0, 1000, total)], "n": rng.integers(0, 99, total)}, schema=SCHEMA)
    atomic_write_parquet(tmp_path / "one.parquet", table)
    bounds = [0, *cuts, total]
    rows = atomic_write_parquet_stream(tmp_path / "streamed.parquet", SCHEMA, (table.slice(a, b - a) for a, b in zip(bounds, bounds[1:])))
    assert rows == total and (tmp_path / "streamed.parquet").read_bytes() == (tmp_path / "one.parquet").read_bytes()


def test_a_failed_stream_leaves_no_file(tmp_path):
    def pieces():
        yield SCHEMA.empty_table()
        raise OSError("disk went away")

    with pytest.raises(OSError, match="disk went away"):
        atomic_write_parquet_stream(tmp_path / "out.parquet", SCHEMA, pieces())
    assert list(tmp_path.iterdir()) == []
