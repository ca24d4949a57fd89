"""The evaluation suite's scoring on models whose log-likelihoods are known by construction."""
from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
import torch.nn as nn

from hymo_core.eval.suite import (choice_items, first_n, gsm8k_extract, gsm8k_normalise, humaneval_program, macro_average,
                                  score_choices, hellaswag_item)
from hymo_core.eval.lm_scoring import Request, score_requests
from manifests.benchmark_sets import eval_items


class BigramTable(nn.Module):
    """logits(next | current) = table[current]: every log-likelihood can be worked out by hand."""

    def __init__(self, table: list[list[float]], max_seq_len: int = 8):
        super().__init__()
        self.table = torch.tensor(table)
        self.config = SimpleNamespace(max_seq_len=max_seq_len)

    def forward(self, tokens_BT: torch.Tensor):
        return self.table[tokens_BT], None


class PrefersTokens(nn.Module):
    """The same logits at every position: +20 on `preferred` ids, 0 elsewhere."""

    def __init__(self, vocab_size: int, preferred: set[int], max_seq_len: int = 512):
        super().__init__()
        self.bias_V = torch.zeros(vocab_size)
        self.bias_V[sorted(preferred)] = 20.0
        self.config = SimpleNamespace(max_seq_len=max_seq_len)

    def forward(self, tokens_BT: torch.Tensor):
        return self.bias_V.expand(*tokens_BT.shape, -1).clone(), None


class CharTokenizer:
    """One id per character of a fixed alphabet: the test controls every token boundary."""

    def __init__(self, alphabet: str):
        self.alphabet = alphabet

    def encode(self, text: str, add_special_tokens: bool = False):
        return SimpleNamespace(ids=[self.alphabet.index(c) for c in text])

    def decode(self, ids: list[int]) -> str:
        return "".join(self.alphabet[i] for i in ids)


# log-softmax rows of this table, by hand: row 0 = [2, 0, 0] -> log(e^2 / (e^2 + 2)), log(1 / (e^2 + 2)) ...
TABLE = [[2.0, 0.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 3.0]]


def log_p(row: int, col: int) -> float:
    logits = TABLE[row]
    return logits[col] - math.log(sum(math.exp(v) for v in logits))


def test_continuation_loglikelihood_matches_hand_computation():
    model = BigramTable(TABLE)
    scored = score_requests(model, [Request((0,), (0, 1)), Request((2, 1), (2,)), Request((1,), (1, 1, 2))], batch_size=2)
    assert scored[0].logprob == pytest.approx(log_p(0, 0) + log_p(0, 1), abs=1e-6)
    assert scored[1].logprob == pytest.approx(log_p(1, 2), abs=1e-6)
    assert scored[2].logprob == pytest.approx(log_p(1, 1) + log_p(1, 1) + log_p(1, 2), abs=1e-6)
    assert [s.tokens for s in scored] == [2, 1, 3] and not any(s.greedy for s in scored)
    (greedy,) = score_requests(model, [Request((1,), (1, 1))])
    assert greedy.greedy and greedy.logprob == pytest.approx(2 * log_p(1, 1), abs=1e-6)
    # batch size and order never change a number
    again = score_requests(model, [Request((1,), (1, 1, 2)), Request((0,), (0, 1))], batch_size=1)
    assert again[0].logprob == pytest.approx(scored[2].logprob, abs=1e-6) and again[1].logprob == pytest.approx(scored[0].logprob, abs=1e-6)


def test_window_keeps_the_newest_context_tokens():
    model = BigramTable(TABLE, max_seq_len=2)
    (scored,) = score_requests(model, [Request((2, 2, 2, 0), (1, 2))])  # window: [0, 1, 2]
    assert scored.logprob == pytest.approx(log_p(0, 1) + log_p(1, 2), abs=1e-6) and not scored.truncated


def test_choice_accuracies_by_hand():
    # alphabet "ab ": a=0, b=1, space=2. Context "a"; options " a" vs " bb"
    tokenizer = CharTokenizer("ab ")
    model = BigramTable(TABLE)
    from hymo_core.eval.suite import ChoiceItem

    items = [ChoiceItem("x", "a", (" a", " bb"), answer=1), ChoiceItem("y", "b", (" a", " b"), answer=0)]
    result = score_choices(model, tokenizer, items)
    option_scores = [[log_p(0, 2) + log_p(2, 0), log_p(0, 2) + log_p(2, 1) + log_p(1, 1)],
                     [log_p(1, 2) + log_p(2, 0), log_p(1, 2) + log_p(2, 1)]]
    for row, expected in zip(result["per_item"], option_scores):
        assert row["logprobs"] == pytest.approx(expected, abs=1e-6)
    raw = [max(range(2), key=lambda k: s[k]) for s in option_scores]
    # lm-eval's acc_norm divides by the choice's characters without the delimiter: " bb" counts 2
    per_char = [max(range(2), key=lambda k: s[k] / len(item.options[k].lstrip(" "))) for s, item in zip(option_scores, items)]
    assert result["accuracy"] == sum(p == item.answer for p, item in zip(raw, items)) / 2
    assert result["accuracy_per_char"] == sum(p == item.answer for p, item in zip(per_char, items)) / 2
    # lm-eval's standard error: sample variance (n - 1)
    assert result["chance"] == 0.5 and result["accuracy_stderr"] == pytest.approx(math.sqrt(result["accuracy"] * (1 - result["accuracy"]) / 1))


def test_acc_norm_divides_by_the_choice_without_its_delimiter_and_acc_bytes_by_its_bytes():
    """An item where dividing by len(" " + choice) (the old, wrong convention) picks the other option."""
    from hymo_core.eval.suite import ChoiceItem

    model, tokenizer = BigramTable(TABLE), CharTokenizer("ab ")
    (row,) = score_choices(model, tokenizer, [ChoiceItem("x", "a", (" aa", " aab"), answer=1)])["per_item"]
    lls = row["logprobs"]
    assert lls[1] / 3 > lls[0] / 2 and lls[1] / 4 < lls[0] / 3  # lm-eval: 3 and 2 characters; with the space: 4 and 3
    assert row["pick_per_char"] == 1 and row["pick_per_byte"] == 1  # ASCII: bytes = characters
    assert row["bits_per_byte_gold"] == pytest.approx(-lls[1] / (math.log(2) * 4))  # the gold continuation " aab": 4 bytes


def test_pmi_and_the_standard_errors_follow_olmes_and_lm_eval():
    from hymo_core.eval.metrics import sample_stderr, wilson_interval
    from hymo_core.eval.suite import ChoiceItem

    tokenizer = CharTokenizer("Answer: abcdefghijklmnopqrstuvwxyz?")
    model = PrefersTokens(len(tokenizer.alphabet), set(tokenizer.encode("b").ids), max_seq_len=64)
    (row,) = score_choices(model, tokenizer, [ChoiceItem("x", "a?", (" b", " c"), answer=1)], uncond=True)["per_item"]
    # unconditional scores are log p(choice | "Answer:"): the same constant logits, so PMI is conditional minus the same terms
    assert row["logprobs_uncond"] == pytest.approx(row["logprobs"], abs=1e-5)
    assert row["pick"] == 0
    assert sample_stderr(0.5, 4) == pytest.approx(math.sqrt(0.25 / 3)) and math.isnan(sample_stderr(1.0, 1))
    low, high = wilson_interval(0.0, 5)
    assert low == 0.0 and high == pytest.approx(0.4345, abs=1e-4)  # the textbook Wilson bound for 0 of 5
    assert wilson_interval(1.0, 1)[0] == pytest.approx(0.2065, abs=1e-4)


def test_few_shot_examples_come_from_a_split_never_scored():
    from hymo_core.eval.suite import choose_shots, task_shots

    for task in ("hellaswag", "arc_easy", "arc_challenge", "gsm8k"):
        shots, files = task_shots(task, 5, 1234)
        assert len(shots) == 5 and len(files) == 1
        scored = [r for r in eval_items(task)[0]]
        texts = "\n".join(str(v) for r in scored for v in r.values())
        assert not any(shot["text"].split("\n")[0].removeprefix("Question: ") in texts for shot in shots), task
    shots, _ = task_shots("mmlu", 3, 1234)
    assert len(shots) == 57 and all(len(v) == 3 and all("/dev/" in s["id"] for s in v) for v in shots.values())
    pool = [{"text": str(i)} for i in range(5)]
    assert choose_shots(pool, 5, 1234) == pool  # all of OLMES's curated shots, in OLMES's order
    assert choose_shots(pool, 2, 1234) == choose_shots(pool, 2, 1234) != choose_shots(pool, 2, 7)
    items = choice_items("arc_easy", eval_items("arc_easy")[0][:2], shots=task_shots("arc_easy", 2, 1234)[0])
    assert items[0].context.count("Question:") == 3 and items[0].context.endswith("Answer:")


def test_a_model_that_always_prefers_option_a_scores_the_share_of_a_answers():
    records = first_n(eval_items("mmlu")[0], 8, lambda r: r["subject"])
    items = choice_items("mmlu", records, mmlu_format="letters")
    alphabet = sorted({c for item in items for c in item.context + "".join(item.options)})
    tokenizer = CharTokenizer("".join(alphabet))
    model = PrefersTokens(len(alphabet), set(tokenizer.encode(" A").ids), max_seq_len=32)
    result = score_choices(model, tokenizer, items, batch_size=256)
    share_a = sum(r["answer"] == 0 for r in records) / len(records)
    assert 0 < share_a < 1 and result["accuracy"] == share_a and result["accuracy_per_char"] == share_a
    assert all(row["pick"] == 0 for row in result["per_item"])
    macro = macro_average(result["per_item"])
    by_subject = {}
    for r in records:
        by_subject.setdefault(r["subject"], []).append(r["answer"] == 0)
    assert len(macro["subjects"]) == 57
    assert macro["accuracy"] == pytest.approx(sum(sum(v) / len(v) for v in by_subject.values()) / len(by_subject))


def test_every_bundled_benchmark_loads_and_matches_what_decontam_reads():
    sizes = {}
    for name in ("hellaswag", "arc_easy", "arc_challenge", "mmlu", "gsm8k", "humaneval"):
        items, files = eval_items(name)
        sizes[name] = len(items)
        assert all(len(digest) == 64 for digest in files.values())
    assert sizes == {"hellaswag": 10042, "arc_easy": 2376, "arc_challenge": 1172, "mmlu": 14042, "gsm8k": 1319, "humaneval": 164}
    first = hellaswag_item(eval_items("hellaswag")[0][0])
    assert first.context == "Roof shingle removal: A man is sitting on a roof. He" and first.options[3] == " starts pulling up roofing on a roof."


def test_a_structured_item_that_differs_from_the_decontam_text_is_refused(tmp_path, monkeypatch):
    import gzip
    import json

    import manifests.benchmark_sets as sets

    records, _ = eval_items("arc_challenge")
    records[5] = {**records[5], "choices": [*records[5]["choices"][:-1], "something else"]}
    (tmp_path / "arc_challenge.jsonl.gz").write_bytes(gzip.compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    monkeypatch.setattr(sets, "EVAL_DIR", tmp_path)
    with pytest.raises(ValueError, match=r"item 5 .* is not the item"):
        sets.eval_items("arc_challenge")


def test_gsm8k_answer_extraction_follows_lm_eval():
    assert gsm8k_extract("so she has 9 eggs.\n#### 1,018") == ("1,018", "1,018")
    assert gsm8k_extract("The answer is $18.") == (None, "$18.")
    assert gsm8k_normalise("$18.") == "18" and gsm8k_normalise("1,018") == "1018"
    assert gsm8k_extract("no digits here") == (None, None)


def test_humaneval_canonical_solutions_pass_and_a_wrong_one_fails():
    from hymo_core.eval.sandbox import run_check
    from hymo_core.eval.suite import humaneval_check

    records, _ = eval_items("humaneval")
    for record in records[:3]:
        assert run_check(humaneval_program(record, record["canonical_solution"]), humaneval_check(record), 20).passed, record["id"]
    wrong = run_check(humaneval_program(records[0], "    return None\n"), humaneval_check(records[0]), 20)
    assert not wrong.passed and wrong.status == "failed" and "AssertionError" in wrong.detail


def test_reports_never_go_into_a_published_stage_directory(tmp_path):
    from hymo_core.eval.report import default_out

    stage = tmp_path / "run" / "13_pretrain"
    (stage / "checkpoints").mkdir(parents=True)
    (stage / "manifest.json").write_text("{}")
    assert default_out(stage / "checkpoints" / "step-00000200.pt") == tmp_path / "run" / "eval" / "13_pretrain-step-00000200"
    assert default_out(tmp_path / "train" / "checkpoints" / "step-00000003.pt") == tmp_path / "train" / "eval" / "step-00000003"
