"""bench/kernel_resources.py --triton-env: the side-by-side table of two tritons' sm_90 compiles, and a clear
error when the other interpreter cannot produce its compile."""
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from bench import kernel_resources  # noqa: E402


def usage(kernel, registers, spill=0, problems=(), target="sm_90"):
    return {"kernel": kernel, "preset": "hymo-750m", "shape": "K=128 V=256", "config": "w4 s2", "target": target,
            "shared": 2048, "registers": registers, "spill": spill, "programs_per_sm": 1, "programs": 10, "waves": 1,
            "problems": list(problems)}


def test_versions_table_puts_both_tritons_side_by_side_and_counts_what_does_not_fit_on_the_device():
    ours = {"triton": "3.9.0", "usages": [usage("a.k1", 100), usage("a.k2", 120), usage("a.k1", 90, target="sm_80")]}
    theirs = {"triton": "3.6.0", "usages": [usage("a.k1", 110), usage("a.k2", 130, 8, ["spills 8 B/thread > budget 0 B"]),
                                            usage("a.k3", 50)]}
    table, misfits = kernel_resources.versions_table(ours, theirs)
    lines = table.splitlines()
    assert "registers 3.6.0" in lines[0] and "registers 3.9.0" in lines[0] and "verdict 3.6.0" in lines[0]
    assert lines[2] == "| a.k1 | hymo-750m | K=128 V=256 | w4 s2 | 2.0 | 2.0 | 110 | 100 | 0 | 0 | fits |"
    assert lines[3].endswith("| 130 | 120 | 8 | 0 | spills 8 B/thread > budget 0 B |")
    assert lines[4].endswith("| 50 | - | 0 | - | fits |")  # compiled only under 3.6
    assert len(lines) == 5 and misfits == 1  # sm_80 rows are not part of the device's table


def test_another_interpreter_that_cannot_compile_is_a_clear_error(tmp_path):
    broken = tmp_path / "python"
    broken.write_text("#!/bin/sh\necho 'ModuleNotFoundError: No module named triton' >&2\nexit 1\n")
    broken.chmod(0o755)
    with pytest.raises(RuntimeError, match=r"--json failed \(exit 1\): ModuleNotFoundError: No module named triton"):
        kernel_resources.run_in(str(broken), ["sm_90"])
