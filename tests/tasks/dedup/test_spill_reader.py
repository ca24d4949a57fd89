from __future__ import annotations

import numpy as np
import pytest

from tasks.dedup.minhash import ChecksumMismatch, write_checked_array
from tasks.dedup.spill_reader import SpillFiles


def test_slices_and_rows_match_the_saved_array_and_nothing_stays_mapped(tmp_path, monkeypatch):
    flat, grid = tmp_path / "flat.npy", tmp_path / "grid.npy"
    values = np.arange(1000, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    keys = values[:999].reshape(3, 333)
    spill = SpillFiles()
    spill.verify(str(flat), write_checked_array(flat, values))
    spill.verify(str(grid), write_checked_array(grid, keys))
    assert np.array_equal(spill.read(str(flat), 17, 400), values[17:400]) and len(spill.read(str(flat), 5, 5)) == 0
    assert all(np.array_equal(spill.row(str(grid), band), keys[band]) for band in range(3))
    monkeypatch.setattr("tasks.dedup.spill_reader.OPEN_FILES", 1)  # descriptors are recycled, reads stay right
    assert np.array_equal(spill.read(str(flat), 990, 1000), values[990:]) and np.array_equal(spill.row(str(grid), 2), keys[2])
    spill.close()
    assert not spill.handles


def test_a_corrupt_or_short_spill_file_is_refused(tmp_path):
    path = tmp_path / "part-00003.shingles.npy"
    digest = write_checked_array(path, np.arange(10, dtype=np.uint64))
    path.write_bytes(path.read_bytes()[:-1] + b"\x01")
    with pytest.raises(ChecksumMismatch, match=r"part-00003\.shingles\.npy.*corrupt"):
        SpillFiles().verify(str(path), digest)
    digest = write_checked_array(path, np.arange(10, dtype=np.uint64))
    spill = SpillFiles()
    spill.verify(str(path), digest)
    with pytest.raises(OSError, match="ended early"):
        spill.read(str(path), 5, 11)
