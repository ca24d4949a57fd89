"""bench/gpu_check.py --dry-run: the GPU check's plans are made (and its models built on meta) on the CPU."""
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_dry_run_plans_every_check_without_touching_cuda(tmp_path):
    # CUDA_VISIBLE_DEVICES="" and a poisoned torch.cuda.init: the dry run must stop before any CUDA call.
    code = ("import sys, runpy, torch; torch.cuda.init = lambda: (_ for _ in ()).throw(RuntimeError('CUDA touched')); "
            f"sys.argv = ['gpu_check.py', '--dry-run', '--out', {str(tmp_path)!r}]; "
            f"runpy.run_path({str(REPO / 'bench' / 'gpu_check.py')!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO),
                              "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] is True and report["kernels"] == []
    assert report["gdn"]["tokens_per_call"] == 4 * 4096 and report["gdn"]["shape"]["V"] == 256
    rows = {(row["model"], row["compile"]): row for row in report["mfu"]}
    assert set(rows) == {(m, c) for m in ("dense-125m", "hymo-750m") for c in (False, True)}
    assert 100e6 < rows[("dense-125m", False)]["parameters"] < 150e6
    assert rows[("hymo-750m", True)]["flops_per_token"] > rows[("dense-125m", True)]["flops_per_token"]
    table = (tmp_path / "gpu_check.md").read_text()
    assert "not measured on a GPU" in table and "| hymo-750m | on |" in table
