"""Scoring conventions, each under the name of the harness that defines it, and their uncertainty.

Multiple choice, per item, from the summed log-likelihood ``ll_i`` of each option's continuation
(``delimiter + choice``, the delimiter a single space):

| key | pick | convention |
|---|---|---|
| ``accuracy`` | argmax ll_i | lm-evaluation-harness ``acc`` = OLMES ``acc_raw`` |
| ``accuracy_per_char`` | argmax ll_i / len(choice) | lm-evaluation-harness ``acc_norm``: characters of the choice, the delimiter not counted |
| ``accuracy_per_byte`` | argmax ll_i / len(choice.encode("utf-8")) | lm-evaluation-harness ``acc_bytes`` |
| ``accuracy_per_token`` | argmax ll_i / tokens_i | OLMES ``acc_per_token`` |
| ``accuracy_uncond`` | argmax ll_i - ll(continuation_i given "Answer:") | OLMES ``acc_uncond`` (PMI; OLMES's primary for ARC-Challenge) |
| ``bits_per_byte_gold`` | -ll_gold / (ln 2 * UTF-8 bytes of the gold continuation), mean over items | OLMo / oe-eval ``bits_per_byte_corr`` |

Standard errors are lm-evaluation-harness's ``mean_stderr``: the sample standard deviation (n - 1)
over sqrt(n), which for a 0/1 score is sqrt(p (1 - p) / (n - 1)); undefined (NaN) below n = 2, where
lm-eval has none either. Every proportion also carries its 95 % Wilson score interval, which stays
honest where n is small or p is 0 or 1.
"""
from __future__ import annotations

import math
from typing import Any

UNCOND_CONTEXT = "Answer:"
Z95 = 1.959963984540054
LABELS = {
    "accuracy": "lm-eval acc = OLMES acc_raw (argmax of summed log-likelihood)",
    "accuracy_per_char": "lm-eval acc_norm (log-likelihood / characters of the choice, delimiter excluded)",
    "accuracy_per_byte": "lm-eval acc_bytes (log-likelihood / UTF-8 bytes of the choice)",
    "accuracy_per_token": "OLMES acc_per_token (log-likelihood / continuation tokens)",
    "accuracy_uncond": "OLMES acc_uncond (PMI: log p(c | prompt) - log p(c | \"Answer:\"))",
    "bits_per_byte_gold": "OLMo bits_per_byte_corr (-log2 p(gold continuation) / its UTF-8 bytes, mean over items)",
    "exact_match_strict": "lm-eval gsm8k exact_match, strict-match (#### n)",
    "exact_match_flexible": "lm-eval gsm8k exact_match, flexible-extract (last number)",
    "pass_at_1": "lm-eval humaneval pass@1 (greedy)",
    "stderr": "lm-eval mean_stderr: sample sd (n - 1) / sqrt(n)",
    "wilson95": "95 % Wilson score interval",
}
PICKS = {"accuracy": "pick", "accuracy_per_char": "pick_per_char", "accuracy_per_byte": "pick_per_byte",
         "accuracy_per_token": "pick_per_token", "accuracy_uncond": "pick_uncond"}


def sample_stderr(p: float, n: int) -> float:
    """lm-eval's standard error of a mean of n 0/1 scores with mean p (sample variance, n - 1)."""
    return math.sqrt(p * (1.0 - p) / (n - 1)) if n >= 2 else float("nan")


def wilson_interval(p: float, n: int, z: float = Z95) -> list[float]:
    """[low, high] of the Wilson score interval for a proportion p of n trials ([0, 1] at n = 0)."""
    if n == 0:
        return [0.0, 1.0]
    denominator = 1.0 + z * z / n
    centre = (p + z * z / (2 * n)) / denominator
    half = z * math.sqrt(p * (1.0 - p) / n + z * z / (4 * n * n)) / denominator
    return [max(0.0, centre - half), min(1.0, centre + half)]


def proportion(name: str, hits: int, n: int) -> dict[str, Any]:
    """{name, name_stderr, name_wilson95} for `hits` successes of `n`."""
    p = hits / n if n else float("nan")
    return {name: p, f"{name}_stderr": sample_stderr(p, n), f"{name}_wilson95": wilson_interval(p if n else 0.0, n)}


def mean_with_stderr(name: str, values: list[float]) -> dict[str, Any]:
    n = len(values)
    mean = sum(values) / n if n else float("nan")
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1)) if n >= 2 else float("nan")
    return {name: mean, f"{name}_stderr": sd / math.sqrt(n) if n >= 2 else float("nan")}


def bits_per_byte(nats: float, n_bytes: int) -> float:
    """Total negative log-likelihood in nats over the UTF-8 bytes it covers, in bits per byte."""
    return nats / (math.log(2) * n_bytes) if n_bytes else float("nan")


def choice_text(option: str) -> str:
    """The choice without the target delimiter (one leading space) that the continuation carries."""
    return option[1:] if option.startswith(" ") else option


def _argmax(values: list[float]) -> int:
    return max(range(len(values)), key=values.__getitem__)  # ties: the first option, as numpy's argmax


def item_picks(options: tuple[str, ...], logprobs: list[float], tokens: list[int], uncond: list[float] | None) -> dict[str, int]:
    """Each convention's pick for one item."""
    choices = [choice_text(o) for o in options]
    picks = {"pick": _argmax(logprobs),
             "pick_per_char": _argmax([ll / max(len(c), 1) for ll, c in zip(logprobs, choices)]),
             "pick_per_byte": _argmax([ll / max(len(c.encode("utf-8")), 1) for ll, c in zip(logprobs, choices)]),
             "pick_per_token": _argmax([ll / max(t, 1) for ll, t in zip(logprobs, tokens)])}
    if uncond is not None:
        picks["pick_uncond"] = _argmax([c - u for c, u in zip(logprobs, uncond)])
    return picks
