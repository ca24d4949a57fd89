"""A slice index on disk: a reader finds its partition's slice by one entry, and a corrupt entry is caught."""
import numpy as np
import pytest

from tasks.dedup.minhash import ChecksumMismatch
from tasks.dedup.near_dup_files import write_partitioned
from tasks.dedup.slice_index import INDEX_ENTRY, index_path, numbered_file, partition_slices, write_slice_index
from tasks.dedup.spill_reader import SpillFiles


def test_each_partition_reads_back_its_elements_from_every_writer_and_a_cut_entry_fails(tmp_path):
    for writer in range(3):
        values = np.arange(10, dtype=np.int64) + 100 * writer
        path = numbered_file(tmp_path, writer)
        assert write_slice_index(path, write_partitioned(tmp_path / f"{writer:06d}.npy", values, values % 4, 4)) == 4
    spill = SpillFiles()
    for part in range(4):
        slices = partition_slices(spill, tmp_path, 3, part)
        got = np.concatenate([spill.read_checked_slice(s.path, s.start, s.stop, s.sha256) for s in slices])
        assert got.tolist() == [v + 100 * w for w in range(3) for v in range(10) if v % 4 == part]
    index = np.load(index_path(numbered_file(tmp_path, 1)))
    index["stop"][2] = index["start"][2]  # partition 2 of writer 1 cut to nothing: its recorded sha256 no longer matches
    np.save(index_path(numbered_file(tmp_path, 1)), index.astype(INDEX_ENTRY))
    fresh = SpillFiles()
    [cut] = [s for s in partition_slices(fresh, tmp_path, 3, 2) if s.path.endswith("000001.npy")]
    with pytest.raises(ChecksumMismatch, match="000001.npy"):
        fresh.read_checked_slice(cut.path, cut.start, cut.stop, cut.sha256)
