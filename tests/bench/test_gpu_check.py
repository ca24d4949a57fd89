"""bench/gpu_check.py on the CPU: the dry run plans every row without CUDA, and one row's failure or the
budget never costs the other rows (the first GPU lease is 15 minutes, one command: it must return something)."""
import json
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from bench import gpu_check  # noqa: E402


def test_dry_run_plans_every_row_without_touching_cuda(tmp_path):
    # CUDA_VISIBLE_DEVICES="" and a poisoned torch.cuda.init: the dry run must stop before any CUDA call.
    # $OUT is set, so the files go there and not to --out.
    code = ("import sys, runpy, torch; torch.cuda.init = lambda: (_ for _ in ()).throw(RuntimeError('CUDA touched')); "
            f"sys.argv = ['gpu_check.py', '--dry-run', '--out', {str(tmp_path / 'not-here')!r}]; "
            f"runpy.run_path({str(REPO / 'bench' / 'gpu_check.py')!r}, run_name='__main__')")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO),
                              "OMP_NUM_THREADS": "1", "OUT": str(tmp_path)})
    assert out.returncode == 0, out.stderr[-3000:]
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    assert report["dry_run"] is True and "6 L d T" in report["flop_convention"]
    rows = {row["row"]: row for row in report["rows"]}
    assert [row.name for row in gpu_check.rows()] == list(rows)
    assert all(row["status"] == "planned" for row in rows.values())
    assert {row["group"] for row in rows.values()} == set(gpu_check.GROUPS)
    for group in gpu_check.GROUPS:  # each group fits one lease command of 8 minutes (`--only GROUP`)
        assert sum(row["expected_min"] for row in rows.values() if row["group"] == group) <= 8, group
    profile = json.loads((tmp_path / "gpu_profile.json").read_text())
    from bench.gpu_profile import PROFILE_VARIANTS, validate

    validate(profile)
    assert [r["row"] for r in profile["rows"]] == [v.row for v in PROFILE_VARIANTS]
    variants = [r["variant"] for r in profile["rows"]]
    assert {v["sdpa"] for v in variants} == {"flash", "cudnn", "efficient"}
    assert {(v["fsdp"], v["compile"]) for v in variants} >= {(False, False), (True, False), (False, True)}
    assert {v["accumulation"] for v in variants} == {1, 8}
    hybrid = [r["variant"] for r in profile["rows"] if r["model"] == "hymo-750m"]  # issue 54: the hybrid profiled too
    assert {(v["batch"], v["seq_len"], v["compile"]) for v in hybrid} == {(2, 4096, False), (2, 4096, True)}
    assert profile["rows"][0]["launch_budget"]["optimizer"] < 200  # the meta count of the same step, planned on the CPU
    gdn = rows["gdn ours"]
    assert gdn["tokens_per_call"] == 4 * 4096 and gdn["shape"]["V"] == 256
    mfu = {(row["model"], row["compile"]): row for row in rows.values() if "model" in row and row["group"] == "mfu"}
    assert rows["mfu matmul peak"]["flops"] == 2 * 8192**3
    assert set(mfu) == {(m, c) for m in ("dense-125m", "hymo-750m") for c in (False, True)}
    assert 100e6 < mfu[("dense-125m", False)]["parameters"] < 150e6
    assert mfu[("hymo-750m", True)]["flops_per_token"] > mfu[("dense-125m", True)]["flops_per_token"]
    # the figures: NorMuon's Newton-Schulz at hymo-750m is 7.48 TFLOP a step against 33.75 for the model
    assert mfu[("hymo-750m", False)]["ns_flops_per_step"] / 1e12 == pytest.approx(7.48, abs=0.01)
    assert mfu[("hymo-750m", False)]["model_flops_per_step"] / 1e12 == pytest.approx(33.75, abs=0.01)
    assert mfu[("hymo-750m", False)]["ns_dtype"] in ("float32", "bfloat16")
    table = (tmp_path / "gpu_check.md").read_text()
    assert "not measured on a GPU" in table and "| hymo-750m | on |" in table and "FLOP convention" in table
    assert "[mfu] mfu hymo-750m compile on: planned" in out.stdout  # each row printed as it finished


def test_a_failing_row_is_recorded_and_the_next_rows_still_run(tmp_path, monkeypatch):
    """Row 2 raises; every later row runs and finds the error already on disk; a row that needs more than
    the budget left is skipped and recorded, and a shorter one after it still runs."""
    clock = [0.0]
    monkeypatch.setattr(gpu_check, "_clock", lambda: clock[0])
    seen_on_disk: dict[str, list] = {}
    original = gpu_check.rows

    def injected_rows():
        out = original()
        for index, row in enumerate(out):
            plan = row.plan
            if index == 1:
                def plan(name=row.name):
                    raise RuntimeError(f"injected failure in {name}")

            def watched(plan=plan, name=row.name):
                # the JSON as it is on disk when this row starts
                seen_on_disk[name] = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
                return plan()
            if row.name == "gdn ours":  # this row "takes" 390 s of the 420 s budget: 30 s are left
                def watched(plan=watched):
                    clock[0] += 390.0
                    return plan()
            row.plan = watched
        return out

    monkeypatch.setattr(gpu_check, "rows", injected_rows)
    code = gpu_check.main(["--dry-run", "--only", "kernels,gdn,sync", "--budget", "420", "--out", str(tmp_path)])
    assert code == 1  # a row errored
    report = json.loads((tmp_path / "gpu_check.json").read_text())
    status = {row["row"]: row["status"] for row in report["rows"]}
    names = [row.name for row in original() if row.group in ("kernels", "gdn", "sync")]
    assert list(status) == names
    failed = names[1]
    assert status[failed] == "error"
    error_row = next(row for row in report["rows"] if row["row"] == failed)
    assert "injected failure" in error_row["error"] and "RuntimeError" in error_row["traceback"]
    for later in names[2:names.index("gdn ours") + 1]:  # each later row saw the error on disk before it started
        assert status[later] == "planned"
        assert any(r["row"] == failed and r["status"] == "error" for r in seen_on_disk[later])
        assert seen_on_disk[later][-1] == {**seen_on_disk[later][-1], "row": later, "status": "running"}
    assert status["gdn fla"] == "skipped: budget"  # 1 min expected, 30 s left
    assert status["sync step"] == "planned"  # 0.4 min expected: still fits
    assert "gdn fla" not in seen_on_disk  # a skipped row never started
    assert "| gdn fla | 1.00 | - | skipped: budget |" in (tmp_path / "gpu_check.md").read_text()


def test_only_takes_a_comma_list_of_groups_and_refuses_others():
    assert {row.group for row in gpu_check.select("gdn,sync")} == {"gdn", "sync"}
    assert [row.name for row in gpu_check.select(None)] == [row.name for row in gpu_check.rows()]
    with pytest.raises(SystemExit, match="--only kern: not a group"):
        gpu_check.select("kern")


def test_preflight_reports_a_missing_test_file_as_a_failed_check(tmp_path, monkeypatch, capsys):
    passing = tmp_path / "test_passes.py"
    passing.write_text("def test_ok():\n    assert True\n")
    monkeypatch.setattr(gpu_check, "TEST_FILES", ("tests/hymo_core/not_written_yet.py", str(passing)))
    monkeypatch.setattr(gpu_check, "rows", lambda: [gpu_check.Row("kernel rms_norm", "kernels", 0.1, "x",
                                                                  gpu_check.kernel_plan("rms_norm"))])
    assert gpu_check.preflight(tmp_path, None) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("PASS  dry run") and "1 rows planned" in lines[0]
    assert lines[1].startswith("FAIL  tests/hymo_core/not_written_yet.py") and "missing" in lines[1]
    assert lines[2].startswith(f"PASS  {passing}")
    assert lines[-1] == "preflight: 2 of 3 checks pass; failed: tests/hymo_core/not_written_yet.py"


def test_gdn_flops_are_the_planners_forward_term_times_three_not_doubled():
    plan = gpu_check.gdn_plan()
    s = plan["shape"]
    # per token and head, forward: 2 C (3 K + 2 V) + 6 K V FLOPs (2 per multiply-add already); x3 fwd + bwd
    forward = s["H"] * (2 * 64 * (3 * s["K"] + 2 * s["V"]) + 6 * s["K"] * s["V"])
    assert plan["flops"] == 3 * forward * s["B"] * s["T"]


def test_gdn_is_also_timed_at_the_presets_batch_of_two_with_its_state_pass_programs():
    """Issue 54: the H200 row timed B = 4, the preset trains at B = 2, where the state pass gets half the programs."""
    row = next(r for r in gpu_check.rows() if r.name == "gdn ours B=2")
    plan = row.plan()
    assert plan["shape"]["B"] == 2 and plan["tokens_per_call"] == 2 * gpu_check.GDN_SHAPE["T"]
    assert plan["flops"] * 2 == gpu_check.gdn_plan()["flops"]
    s = plan["shape"]
    assert plan["state_pass_programs"]["BV=16"] == 2 * s["H"] * s["V"] // 16 == 224


def test_fla_hopper_guard_is_bypassed_only_inside_the_timing_row(monkeypatch):
    chunk_o = pytest.importorskip("fla.ops.common.chunk_o")
    import torch

    # what the lent H200 looks like to fla-core 0.6.0: Hopper, triton 3.6
    monkeypatch.setattr(chunk_o, "IS_NVIDIA_HOPPER", True)
    monkeypatch.setattr(chunk_o, "TRITON_ABOVE_3_4_0", True)
    monkeypatch.setattr(chunk_o, "TRITON_ABOVE_3_7_1", False)
    x = torch.zeros(1, 64, 1, 16)
    args = dict(q=x, k=x, v=x, do=x, h=x, dh=x, g=torch.zeros(1, 64, 1))
    with pytest.raises(RuntimeError, match="Hopper"):
        chunk_o.chunk_bwd_dqkwg(**args)
    with gpu_check.fla_hopper_guard_bypassed() as how:
        assert "TRITON_ABOVE_3_7_1" in how
        try:
            chunk_o.chunk_bwd_dqkwg(**args)  # on a CPU it fails further on, never at the guard
        except Exception as error:  # noqa: BLE001
            assert "Hopper" not in str(error)
    assert chunk_o.TRITON_ABOVE_3_7_1 is False  # put back after the row


PROBE = """
import sys, json, torch
sys.path.insert(0, {repo!r})
from bench import gpu_check
import hymo_core.kernels.logit_probe as probe
if {broken}:
    right = probe.causal_max_logits_triton
    probe.causal_max_logits_triton = lambda q, k: right(q, k) * 1.05  # a probe kernel 5 % off
print(json.dumps(gpu_check._judge(gpu_check.probe_errors("cpu", torch.float32))))
"""


@pytest.mark.parametrize("broken", [False, True])
def test_the_logit_probe_row_compares_the_triton_probe_with_the_reference(broken):
    # The Triton interpreter runs the real probe kernel on the CPU (fp32: its bf16 dot is not trustworthy).
    out = subprocess.run([sys.executable, "-c", PROBE.format(repo=str(REPO), broken=broken)], capture_output=True,
                         text=True, timeout=600, cwd=REPO,
                         env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "1",
                              "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    row = json.loads(out.stdout.strip().splitlines()[-1])
    assert row["eager_bf16_err"] == 0.0  # the reference against itself, in fp32
    if broken:
        assert row["status"] == "failed" and row["triton_err"] == pytest.approx(0.05, rel=1e-3)
    else:
        assert row["status"] == "ok" and row["triton_err"] < 1e-5


def test_without_fla_its_row_says_so_and_with_ours_timed_the_ratio_is_computed(tmp_path, monkeypatch):
    """The GPU path of the runner (a Context, measure functions), with the CUDA work replaced."""
    monkeypatch.setattr(gpu_check, "fla_available", lambda: "ModuleNotFoundError: No module named 'fla'")
    ours = gpu_check.Row("gdn ours", "gdn", 0.1, "x", gpu_check.gdn_plan, lambda plan, ctx: {"ours_ms": 2.0})
    fla = next(row for row in gpu_check.rows() if row.name == "gdn fla")
    report = gpu_check.Report(device="test", dry_run=False, started="now", budget_s=600)
    gpu_check.run_rows([ours, fla], report, tmp_path, 600, gpu_check.Context())
    on_disk = json.loads((tmp_path / "gpu_check.json").read_text())["rows"]
    assert [r["status"] for r in on_disk] == ["ok", "skipped: fla not installed"]
    assert on_disk[1]["fla"].startswith("fla not installed")
    assert "fla not installed" in (tmp_path / "gpu_check.md").read_text()

    monkeypatch.setattr(gpu_check, "fla_available", lambda: None)
    monkeypatch.setattr(gpu_check, "measure_gdn_fla", lambda plan, ctx: {
        "fla_ms": 3.0, "fla_tflops": 1.0, "fla_over_ours": 3.0 / ctx.results["gdn ours"]["ours_ms"]})
    fla = next(row for row in gpu_check.rows() if row.name == "gdn fla")
    report = gpu_check.Report(device="test", dry_run=False, started="now", budget_s=600)
    gpu_check.run_rows([ours, fla], report, tmp_path, 600, gpu_check.Context())
    assert report.rows[1]["fla_over_ours"] == 1.5 and "(timing only)" in gpu_check.summary(report.rows[1])


# ---------------------------------------------------------------- the profile rows' JSON (bench/gpu_profile.py)


def synthetic_trace(steps: int = 2, kernels_per_step: int = 30):
    """Two 100 ms updates: 20 ms forward, 50 ms backward, 10 ms optimizer ranges; kernels of 30 names, 2 ms
    apart, each 1 ms long (so the GPU is busy kernels_per_step ms of every 100)."""
    from bench.gpu_profile import RANGE_PREFIX, Event

    events = []
    for step in range(steps):
        t0 = step * 150_000.0  # a gap between updates: outside every update, not counted
        events.append(Event("hymo.step", "range", t0, 100_000.0))
        for phase, start, length in (("forward", 0, 20_000), ("backward", 20_000, 50_000), ("optimizer", 75_000, 10_000)):
            events.append(Event(RANGE_PREFIX + phase, "range", t0 + start, length))
        events += [Event(f"kernel_{i % 30}", "kernel", t0 + 2_000.0 * i, 1_000.0 + i) for i in range(kernels_per_step)]
        events.append(Event("kernel_between_steps", "kernel", t0 + 120_000.0, 5_000.0))
    return events


def test_profile_summary_phases_sum_to_the_step_and_kernels_are_attributed():
    from bench.gpu_profile import PHASES, summarise

    summary = summarise(synthetic_trace(kernels_per_step=20), steps=2)
    assert summary["step_ms"] == 100.0 and summary["kernels_per_step"] == 20
    assert list(summary["phases_ms"]) == list(PHASES) + ["other"]
    assert summary["phases_ms"]["backward"] == 50.0 and summary["phases_ms"]["other"] == 20.0
    assert sum(summary["phases_ms"].values()) == pytest.approx(summary["step_ms"])
    busy = sum(1.0 + i / 1000 for i in range(20))  # ms: the kernels do not overlap
    assert summary["gpu_busy_ms_per_step"] == pytest.approx(busy)
    assert summary["gpu_idle_share"] == pytest.approx(1 - busy / 100)
    top = summary["top_kernels"]
    assert top[0]["name"] == "kernel_19" and all(k["calls_per_step"] == 1 for k in top)
    assert sum(k["share"] for k in top) == pytest.approx(1.0)


def test_profile_summary_keeps_25_kernels_and_the_schema_holds_it():
    from bench.gpu_profile import PROFILE_SCHEMA, TOP_KERNELS, summarise, validate

    measured = summarise(synthetic_trace(kernels_per_step=40), steps=2)
    assert len(measured["top_kernels"]) == TOP_KERNELS == 25
    row = {"row": "profile dense-125m eager flash", "model": "dense-125m", "status": "ok",
           "variant": {"fsdp": False, "compile": False, "sdpa": "flash", "batch": 8, "seq_len": 2048, "accumulation": 8},
           **measured}
    summary = {"schema": PROFILE_SCHEMA, "device": "test", "torch": "x", "commit": "x", "started": "x", "rows": [row]}
    validate(summary)
    broken = dict(row, phases_ms={**row["phases_ms"], "other": row["phases_ms"]["other"] + 1.0})
    with pytest.raises(ValueError, match="phases sum to"):
        validate(dict(summary, rows=[broken]))
    with pytest.raises(ValueError, match="schema"):
        validate(dict(summary, schema="hymo.gpu_profile/0"))


def test_profile_summary_refuses_a_trace_without_its_steps():
    from bench.gpu_profile import summarise

    with pytest.raises(ValueError, match="expected 3"):
        summarise(synthetic_trace(steps=2), steps=3)


def test_a_profile_row_runs_the_trainers_step_and_its_phases_sum_to_the_update(one_torch_thread):
    """The GPU row's code on the CPU (host ops stand for kernels): two recorded updates of `train`, every
    phase range inside them, the schema's sums hold."""
    from bench.gpu_profile import PHASES, ProfileVariant, measure, summarise
    from hymo_core.models.configs import SAMPLE_MODEL

    variant = ProfileVariant("dense-125m", fsdp=False, compile=False, sdpa="flash", batch=2, seq_len=16, accumulation=2)
    measured = measure(variant, None, "cpu", SAMPLE_MODEL)
    assert measured["steps"] == 2 and measured["kernels_per_step"] > 100
    phases = measured["phases_ms"]
    assert list(phases) == list(PHASES) + ["other"] and sum(phases.values()) == pytest.approx(measured["step_ms"])
    assert all(phases[p] > 0 for p in ("forward", "backward", "clip", "optimizer"))
    assert 0 <= phases["other"] < 0.2 * measured["step_ms"]  # the named ranges cover the update
