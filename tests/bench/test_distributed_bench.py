"""bench/distributed.py measures through the trainer: `hymo train` rows (all cores, one thread, --nproc), tokens/s from
the run's own metrics and CPU-seconds per update from the processes' CPU time, with the load at start and end."""
import json
import math
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench.distributed import cpu_cases, main  # noqa: E402
from hymo_core.threads import usable_cpus  # noqa: E402
from tests.conftest import write_corpus  # noqa: E402

TINY = ("[train]\nbatch_size = 4\nseq_len = 16\neval_batches = 1\n"
        "[model]\nd_model = 32\nn_layers = 1\nn_heads = 2\nn_kv_heads = 2\nffn_dim = 64\nmax_seq_len = 16\n")


def test_rows_are_the_baseline_on_all_cores_then_one_thread_then_ranks_and_passive_repeats_only_shared_ones():
    cases = cpu_cases(4, passive=True)
    assert [(nproc, threads) for _, nproc, threads, _ in cases] == [(None, 4), (None, 1), (4, 1), (None, 4), (4, 1)]
    assert all(extra == {"OMP_WAIT_POLICY": "PASSIVE"} for *_, extra in cases[3:]) and cases[0][3] == {}
    assert [(nproc, threads) for _, nproc, threads, _ in cpu_cases(1, passive=True)] == [(None, 1)]


def test_the_bench_trains_through_hymo_train_and_reports_cpu_seconds_and_load(tmp_path, monkeypatch):
    corpus = write_corpus(tmp_path / "corpus")
    recipe = tmp_path / "tiny.toml"
    recipe.write_text(TINY, encoding="utf-8")
    for name in ("HYMO_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    result = tmp_path / "rows.json"
    assert main(["--corpus", str(corpus), "--config", str(recipe), "--steps", "2", "--warmup", "1", "--json", str(result)]) == 0
    table = json.loads(result.read_text())
    assert table["header"][:4] == ["launch", "ranks", "threads/rank", "tokens/s"] and "CPU s/update" in table["header"]
    cpus = usable_cpus()
    rows = table["rows"]
    assert [(row[1], row[2]) for row in rows] == ([(1, cpus), (1, 1), (cpus, 1)] if cpus > 1 else [(1, 1)])
    assert rows[0][4] == "1.00x"
    for row in rows:
        # tokens/s; CPU seconds per update is a difference of two runs' totals, so at 2 timed updates only a number
        assert float(row[3].replace(",", "")) > 0 and math.isfinite(float(row[6]))
        before, after = (float(x) for x in row[7].split(" -> "))
        assert before >= 0 and after >= 0
    assert len(table["load_start"]) == len(table["load_end"]) == 3
