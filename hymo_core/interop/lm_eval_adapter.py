"""lm-evaluation-harness's `LM` interface over a HyMo checkpoint, registered as model `hymo`.

    lm_eval --model hymo --model_args checkpoint=RUN/.../step-00000200.pt[,corpus=RUN] --tasks ... \
            --include_path DIR            (DIR from `hymo eval --harness lm-eval` or lm_eval_tasks.write_tasks)

The three request kinds go through the code HyMo's own suite scores with, so numbers agree item by
item: `loglikelihood` splits (context, continuation) into ids as the suite does
(`evaluation.split_ids`) and scores them with `lm_scoring.score_requests`; an empty context is the
EOS token, as lm-eval's `hf` model uses its prefix token. `loglikelihood_rolling` cuts the text into
lm-eval's disjoint rolling windows of max_seq_len (first window after EOS) and sums them.
`generate_until` is greedy only, until a stop string, EOS or `max_gen_toks` (default 256): all of
lm-eval's requests go to `lm_scoring.generate_until_batched` at once (model arg
`generation_batch_size`, default 64, rows decoded together), which gives each request the tokens
the suite's one-at-a-time `generate_until` gives it.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from lm_eval.api.model import LM
from lm_eval.api.registry import register_model
from lm_eval.utils import get_rolling_token_windows, make_disjoint_window

from hymo_core.eval.evaluation import encode, load_tokenizer, split_ids
from hymo_core.eval.lm_scoring import GENERATION_BATCH, GenerationRequest, Request, generate_until_batched, score_requests

DEFAULT_MAX_GEN_TOKS = 256


@register_model("hymo")
class HymoLM(LM):
    """A HyMo model, its corpus tokenizer and EOS id; from a checkpoint path or already loaded objects."""

    def __init__(self, checkpoint: str | None = None, corpus: str | None = None, device: str = "cpu",
                 batch_size: int | str = 64, model: torch.nn.Module | None = None, tokenizer: Any = None,
                 eos_id: int | None = None, generation_batch_size: int | str = GENERATION_BATCH, **_: Any) -> None:
        super().__init__()
        if model is None:
            if checkpoint is None:
                raise ValueError("model hymo: give checkpoint=PATH (and corpus=RUN where it is not above the checkpoint)")
            from hymo_core.checkpoint.load import load_model
            from hymo_core.interop.hf_export import corpus_of

            model, payload = load_model(checkpoint, device)
            reader = corpus_of(Path(checkpoint), payload, corpus)
            tokenizer = load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"])
            eos_id = reader.eos_id
        if tokenizer is None or eos_id is None:
            raise ValueError("model hymo: a loaded model needs its tokenizer and eos_id too")
        self.model, self.tokenizer, self.eos_id = model.eval(), tokenizer, eos_id
        self.device_ = torch.device(device)
        self.batch_size = int(batch_size) if str(batch_size) != "auto" else 64
        self.generation_batch_size = int(generation_batch_size)
        self.boundary_merged = 0  # requests whose context tokens were no prefix of context + continuation

    @property
    def max_length(self) -> int:
        return self.model.config.max_seq_len

    def _pair(self, context: str, continuation: str) -> Request:
        if not context:
            return Request((self.eos_id,), tuple(encode(self.tokenizer, continuation)))
        context_ids, continuation_ids, prefix_ok = split_ids(self.tokenizer, context, continuation)
        self.boundary_merged += not prefix_ok
        return Request(tuple(context_ids), tuple(continuation_ids))

    def loglikelihood(self, requests: list[Any], disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        scored = score_requests(self.model, [self._pair(*r.args) for r in requests], self.device_, self.batch_size)
        return [(s.logprob, s.greedy) for s in scored]

    def loglikelihood_rolling(self, requests: list[Any], disable_tqdm: bool = False) -> list[float]:
        windows, owner = [], []
        for index, request in enumerate(requests):
            (text,) = request.args
            for context, continuation in map(make_disjoint_window, get_rolling_token_windows(
                    token_list=encode(self.tokenizer, text), prefix_token=self.eos_id, max_seq_len=self.max_length, context_len=1)):
                windows.append(Request(tuple(context), tuple(continuation)))
                owner.append(index)
        totals = [0.0] * len(requests)
        for index, scored in zip(owner, score_requests(self.model, windows, self.device_, self.batch_size)):
            totals[index] += scored.logprob
        return totals

    def generate_until(self, requests: list[Any], disable_tqdm: bool = False) -> list[str]:
        """Greedy, all requests decoded together (`generation_batch_size` rows at a time), each exactly as alone."""
        batch = []
        for request in requests:
            context, kwargs = request.args
            kwargs = dict(kwargs or {})
            if kwargs.get("do_sample") or float(kwargs.get("temperature", 0.0) or 0.0) > 0:
                raise ValueError("model hymo: generate_until is greedy only (do_sample false, temperature 0)")
            until = kwargs.get("until") or []
            stop = (until,) if isinstance(until, str) else tuple(until)
            max_new = int(kwargs.get("max_gen_toks", DEFAULT_MAX_GEN_TOKS))
            batch.append(GenerationRequest(tuple(encode(self.tokenizer, context)), stop, max_new))
        generations = generate_until_batched(self.model, self.tokenizer, batch, self.eos_id, self.device_, self.generation_batch_size)
        return [g.text for g in generations]
