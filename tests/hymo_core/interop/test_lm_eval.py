"""lm-evaluation-harness, offline, agrees with HyMo's own suite item by item: through the `hymo` model
on the checkpoint, and through lm-eval's own `hf` model on the transformers export."""
from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("lm_eval")
pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from hymo_core.checkpoint.load import load_model  # noqa: E402
from hymo_core.eval.evaluation import encode, load_tokenizer  # noqa: E402
from hymo_core.eval.suite import run_task  # noqa: E402
from hymo_core.interop.harness import run_harness  # noqa: E402
from hymo_core.interop.lm_eval_tasks import lm_eval_name  # noqa: E402
from hymo_core.train.data import CorpusReader  # noqa: E402

MC = ("hellaswag", "arc_easy", "arc_challenge")
LIMIT = 12


@pytest.fixture(scope="module")
def dense(checkpoints, tiny_run: Path):
    """The dense checkpoint, its tokenizer and EOS."""
    model, _ = load_model(checkpoints["llama"])
    reader = CorpusReader(tiny_run)
    return model, load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"]), reader.eos_id


@pytest.fixture(scope="module")
def suite(dense):
    """HyMo's own suite on the first LIMIT items of each task (MMLU: one per subject; GSM8K: one)."""
    from conftest import single_torch_thread

    model, tokenizer, eos_id = dense
    with single_torch_thread():
        scores = {task: run_task(task, model, tokenizer, limit=LIMIT, eos_id=eos_id) for task in MC}
        scores["mmlu"] = run_task("mmlu", model, tokenizer, limit=1, eos_id=eos_id)
        scores["gsm8k"] = run_task("gsm8k", model, tokenizer, limit=1, eos_id=eos_id, max_new_tokens={"gsm8k": 256})
    return scores


def lm_eval_norm_pick(logprobs: list[float], choices: list[str]) -> int:
    """lm-eval's acc_norm pick: log-likelihood over the choice's length in characters, delimiter excluded."""
    normalised = [lp / len(choice) for lp, choice in zip(logprobs, choices)]
    return max(range(len(normalised)), key=normalised.__getitem__)


def assert_agrees(report: dict, suite: dict) -> None:
    from hymo_core.eval.suite import choice_items, first_n
    from manifests.benchmark_sets import eval_items

    for task in MC:
        items = report["items"][lm_eval_name(task)]
        ours = suite[task]["per_item"]
        assert len(items) == len(ours) == LIMIT
        options = [item.options for item in choice_items(task, first_n(eval_items(task)[0], LIMIT))]
        for theirs, mine, opts in zip(sorted(items, key=lambda r: r["doc_id"]), ours, options):
            assert theirs["loglikelihoods"] == pytest.approx(mine["logprobs"], abs=1e-4)
            assert theirs["acc"] == float(mine["pick"] == mine["answer"])
            assert theirs["acc_norm"] == float(lm_eval_norm_pick(mine["logprobs"], [o[1:] for o in opts]) == mine["answer"])
        results = report["results"][lm_eval_name(task)]
        assert results["acc,none"] == pytest.approx(suite[task]["accuracy"], abs=1e-12)
        assert results["acc_stderr,none"] == pytest.approx(suite[task]["accuracy_stderr"], abs=1e-12)  # sd / sqrt(n), as the suite's


def test_hymo_model_in_lm_eval_agrees_with_the_suite(suite, checkpoints, tiny_run: Path, tmp_path: Path):
    report = run_harness(checkpoints["llama"], list(MC), tmp_path / "mc", corpus=tiny_run, limit=LIMIT)
    assert report["route"] == "hymo"
    assert_agrees(report, suite)
    assert (tmp_path / "mc" / "lm_eval.json").is_file() and (tmp_path / "mc" / "lm_eval_tasks" / "hymo_hellaswag.yaml").is_file()
    # MMLU: one item per subject (lm-eval's --limit is per subtask, as the suite's), macro-averaged by the group;
    # GSM8K: generate_until gives the suite's greedy generation
    report = run_harness(checkpoints["llama"], ["mmlu", "gsm8k"], tmp_path / "more", corpus=tiny_run, limit=1)
    assert report["groups"]["hymo_mmlu_rc"]["acc,none"] == pytest.approx(suite["mmlu"]["accuracy"], abs=1e-12)
    strict = [g for g in report["items"]["hymo_gsm8k"] if g["filter"] == "strict-match"]
    assert [g["generation"] for g in strict] == [r["generation"] for r in suite["gsm8k"]["per_item"]]
    assert report["results"]["hymo_gsm8k"]["exact_match,flexible-extract"] == suite["gsm8k"]["exact_match_flexible"]


def test_hf_model_on_the_export_agrees_with_the_suite(suite, exports, tmp_path: Path):
    report = run_harness(exports["llama"], list(MC), tmp_path, limit=LIMIT)
    assert report["route"] == "hf"
    assert_agrees(report, suite)


def test_rolling_loglikelihood_matches_lm_evals_hf_model(dense, exports):
    """A text longer than the window: lm-eval's disjoint windows, first one after EOS, summed."""
    from lm_eval.api.instance import Instance
    from lm_eval.models.huggingface import HFLM

    from hymo_core.interop.lm_eval_adapter import HymoLM

    model, tokenizer, eos_id = dense
    text = " ".join(["The river ran past the old mill and the miller's daughter watched the wheel."] * 12)
    assert len(encode(tokenizer, text)) > 2 * model.config.max_seq_len
    request = [Instance("loglikelihood_rolling", {}, (text,), 0)]
    ours = HymoLM(model=model, tokenizer=tokenizer, eos_id=eos_id).loglikelihood_rolling(request)
    theirs = HFLM(pretrained=str(exports["llama"]), dtype="float32", batch_size=4, device="cpu").loglikelihood_rolling(request)
    assert ours[0] == pytest.approx(theirs[0], abs=1e-3) and ours[0] < 0


def test_readme_commands_export_load_and_evaluate(checkpoints, tiny_run: Path, tmp_path: Path, capsys):
    """The README's three commands: `hymo export --hf`, transformers' from_pretrained, `hymo eval DIR --harness lm-eval`."""
    import json

    import transformers

    from flows.cli import main

    assert main(["export", str(checkpoints["llama"]), "--hf", str(tmp_path / "hf"), "--corpus", str(tiny_run)]) == 0
    assert "LlamaForCausalLM" in capsys.readouterr().out
    assert type(transformers.AutoModelForCausalLM.from_pretrained(tmp_path / "hf")).__name__ == "LlamaForCausalLM"
    assert main(["eval", str(tmp_path / "hf"), "--harness", "lm-eval", "--tasks", "arc_easy", "--limit", "2",
                 "--out", str(tmp_path / "lm_eval"), "--json"]) == 0
    out = capsys.readouterr().out
    try:
        rows = json.loads(out)
    except json.JSONDecodeError as error:
        raise AssertionError(f"--json printed more than one JSON document: {out[:2000]!r}") from error
    assert set(rows) == {"hymo_arc_easy"} and 0.0 <= rows["hymo_arc_easy"]["acc,none"] <= 1.0
    assert main(["export", str(checkpoints["llama"]), "--hf", str(tmp_path / "hf"), "--corpus", str(tiny_run)]) == 1
    error = capsys.readouterr().err.strip()
    assert "not an empty directory" in error and "\n" not in error


def test_hybrid_through_lm_evals_hf_model_agrees_with_the_hymo_model(checkpoints, exports, tiny_run: Path, tmp_path: Path):
    """hymo-tiny's export (shipped modeling code, trust_remote_code) scores as the checkpoint does."""
    ours = run_harness(checkpoints["hymo-tiny"], ["arc_easy"], tmp_path / "hymo", corpus=tiny_run, limit=4)
    theirs = run_harness(exports["hymo-tiny"], ["arc_easy"], tmp_path / "hf", limit=4)
    assert theirs["route"] == "hf"
    for a, b in zip(sorted(ours["items"]["hymo_arc_easy"], key=lambda r: r["doc_id"]), sorted(theirs["items"]["hymo_arc_easy"], key=lambda r: r["doc_id"])):
        assert b["loglikelihoods"] == pytest.approx(a["loglikelihoods"], abs=1e-4) and a["acc"] == b["acc"]


def test_hymo_generate_until_decodes_the_requests_together_and_each_as_alone():
    """lm-eval's generate_until requests (ragged contexts, their own `until` and `max_gen_toks`) in one batched decode:
    each string is the suite's one-at-a-time generate_until's."""
    from types import SimpleNamespace

    import torch

    from conftest import AlphabetTokenizer, varied_model
    from hymo_core.eval.lm_scoring import generate_until
    from hymo_core.interop.lm_eval_adapter import HymoLM

    model, tokenizer, eos_id = varied_model(layer_pattern="GM", n_kv_heads=4), AlphabetTokenizer(), 60
    contexts = ["abc", "QuestionXY", "a", "thequickbrownfoxjumpsover", "Zz9"]
    free = [generate_until(model, tokenizer, encode(tokenizer, c), (), 20, eos_id).text for c in contexts]
    kwargs = [{"until": [free[i][6:8]] if i % 2 else "never", "max_gen_toks": 20 - i} for i in range(len(contexts))]
    requests = [SimpleNamespace(args=(c, k)) for c, k in zip(contexts, kwargs)]
    expected = [generate_until(model, tokenizer, encode(tokenizer, c), tuple(k["until"]) if i % 2 else ("never",),
                               k["max_gen_toks"], eos_id).text for i, (c, k) in enumerate(zip(contexts, kwargs))]
    assert len(expected[1]) <= 6 and len(expected[3]) <= 6  # the odd rows end at their stop strings
    batches = []
    forward = model.forward
    model.forward = lambda tokens, **kw: (batches.append(tokens.shape[0]), forward(tokens, **kw))[1]
    lm = HymoLM(model=model, tokenizer=tokenizer, eos_id=eos_id, generation_batch_size=3)
    with torch.no_grad():
        assert lm.generate_until(requests) == expected
    assert max(batches) == 3


def test_written_tasks_are_prefixed_and_load_from_a_copy_of_their_directory(tmp_path: Path, monkeypatch):
    """The YAMLs never shadow lm-eval's own tasks, and they work moved: data paths are relative to the
    task directory, resolved by lm-eval's own task loading offline from an unrelated working directory."""
    import shutil

    from lm_eval.tasks import TaskManager

    from hymo_core.interop.harness import go_offline
    from hymo_core.interop.lm_eval_tasks import write_tasks
    from manifests.benchmark_sets import eval_items

    written = write_tasks(tmp_path / "written", ["arc_easy", "mmlu"])
    assert "hymo_arc_easy" in written and "hymo_mmlu_rc" in written and not {"arc_easy", "mmlu"} & set(written)
    assert all(name.startswith("hymo_") for name in written)
    for yaml in (tmp_path / "written").glob("*.yaml"):
        assert str(tmp_path) not in yaml.read_text() and "/work/" not in yaml.read_text()  # no absolute path
    moved = tmp_path / "elsewhere" / "tasks"
    shutil.copytree(tmp_path / "written", moved)
    shutil.rmtree(tmp_path / "written")
    cwd = tmp_path / "somewhere_else"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    go_offline()
    tasks = TaskManager(include_path=str(moved), include_defaults=False).load(["hymo_arc_easy"])["tasks"]
    docs = list(tasks["hymo_arc_easy"].test_docs())
    assert len(docs) == len(eval_items("arc_easy")[0]) and docs[0]["query"] and docs[0]["choices"]
    (moved / "data" / "arc_easy.jsonl.gz").write_bytes(b"")  # an edited data file is refused by its recorded sha256
    with pytest.raises(ValueError, match="arc_easy.jsonl.gz: sha256"):
        TaskManager(include_path=str(moved), include_defaults=False).load(["hymo_arc_easy"])
