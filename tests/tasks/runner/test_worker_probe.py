"""The cluster probe (issue 45, part 7): every Dask worker must run the flow host's code and find on the run
directory's filesystem what stages do there (atomic directory rename, flock, mmap); otherwise the run is
refused before the first stage, in one line naming the worker and the problem."""
from __future__ import annotations

import errno
import fcntl
import mmap

import pytest

import tasks.runner.code_version as code_version
from tasks.runner.shared_paths import PROBE_PREFIX, SharedPathError, check_shared_paths, storage_problems


@pytest.fixture(scope="module")
def client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster:
        with Client(cluster, set_as_default=False) as client:
            yield client


class InProcess:
    """Client.run's contract (function on every worker -> {worker: answer}) in this process, where a fault can be injected."""

    def run(self, function, *args):
        return {"tcp://in-process:0": function(*args)}


def test_workers_with_the_hosts_code_on_a_real_filesystem_pass(client, tmp_path) -> None:
    check_shared_paths(client, tmp_path, [])
    assert not list(tmp_path.iterdir())  # no probe file or directory left behind


def test_a_worker_running_other_code_is_refused(client, tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(code_version, "code_digest", lambda: "0" * 64)  # the flow host's code, as if edited after the workers started
    with pytest.raises(SharedPathError, match=r"^Dask worker tcp://\S+ runs other code than the flow host \(HyMo .* code digest \w{12}, "
                                              r"the flow host's is 000000000000\).*install the same HyMo") as error:
        check_shared_paths(client, tmp_path, [])
    assert "\n" not in str(error.value)


def test_storage_without_flock_or_mmap_is_refused(tmp_path, monkeypatch) -> None:
    assert storage_problems(str(tmp_path), "a" * 32) == []

    def no_flock(*args):
        raise OSError(errno.ENOLCK, "No locks available")

    monkeypatch.setattr(fcntl, "flock", no_flock)  # as on a FUSE mount of a bucket
    with pytest.raises(SharedPathError, match=r"lacks what stages need: flock fails \(ENOLCK.*use a filesystem with atomic directory rename, flock and mmap"):
        check_shared_paths(InProcess(), tmp_path, [])
    monkeypatch.undo()

    def no_mmap(*args, **kwargs):
        raise OSError(errno.ENODEV, "No such device")

    monkeypatch.setattr(mmap, "mmap", no_mmap)
    assert [detail for _, detail in storage_problems(str(tmp_path), "b" * 32)][0].startswith("mmap fails")
    assert not list(tmp_path.glob(f"{PROBE_PREFIX}*"))
