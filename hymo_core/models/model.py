"""Decoder-only language model: embeddings, a stack of Blocks, final norm, output head.

The dense configuration (layer_pattern "A") is module 8, Lab 2's shape (seed
001) generalised to GQA: pre-RMSNorm, RoPE, SwiGLU, no biases, optional tied
embeddings and QK-norm, residual output projections initialised with
std / sqrt(2 L) so the residual stream's variance does not grow with depth.
Other patterns interleave Gated DeltaNet and MLA mixers (the HyMo hybrid,
seed 000); every block kind lives in hymo_core/models/layers/.

`forward(tokens, targets)` returns `(logits, loss)`, the contract the trainer
relies on (seed 002); with targets the logits are None unless asked for (`return_logits=True`):
the training loss projects and reduces the vocabulary chunk by chunk
(kernels/linear_cross_entropy.py), so the full logits never exist. With `z_loss > 0` the loss is the regularised
objective; the plain cross-entropy of the last forward is in `model.last_ce`.
In training, the loss also carries multi-token prediction (sum_k w_k CE_k,
per-depth CEs in `model.last_mtp_ce`) and any MoE auxiliary loss; evaluation
and generation see the next-token objective only.
Nothing here assumes a single process: no global state, no `.item()` in the
forward, and every parameter is an ordinary module attribute that FSDP2 can
shard.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Callable

import torch
import torch.nn as nn

from hymo_core import kernels
from hymo_core.planner import planner
from hymo_core.models.configs import ModelConfig  # defined torch-free there; part of this module's API
from hymo_core.models.layers.attention import Attention  # noqa: F401  (re-exported: the dense mixer)
from hymo_core.models.layers.block import Block
from hymo_core.models.layers.context import MixerContext, RowPositions
from hymo_core.models.layers.ffn import FeedForward  # noqa: F401  (re-exported)
from hymo_core.models.layers.moe import MoE, Reduce, moe_after_optimizer_step
from hymo_core.models.layers.mtp import MultiTokenPrediction
from hymo_core.models.layers.norm import RMSNorm
from hymo_core.models.materialise import draw_init_seed, initialise_, materialise_, residual_std
from hymo_core.models.mup import init_multiplier, output_multiplier, width_role


def count_parameters(config: ModelConfig) -> int:
    """Parameter count from the config alone; equals the built model's count."""
    return planner.count_parameters(planner.model_shape(config)).total


@dataclass
class DecodeCache:
    """Every layer's cache plus the number of positions already consumed.

    With `row_positions` (`new_cache(..., per_row=True)`) each row is its own sequence at its own
    position: a forward then takes one token per row, row b's at row_positions[b] (batched decoding
    of ragged prompts, hymo_core/eval/batched_greedy.py). Rows are filled from another cache
    (`write_rows`) and dropped (`keep_rows`); a layer cache is a dataclass of batch-first tensors.
    """

    layers: list[Any]
    position: int = 0
    row_positions: list[int] | None = None

    def write_rows(self, rows: list[int], source: "DecodeCache") -> None:
        """Rows `rows` of this per-row cache become the rows of `source` (a plain cache, one row each), at its position."""
        if self.row_positions is None or source.row_positions is not None:
            raise ValueError("write_rows copies a plain cache's rows into a per-row cache")
        index = torch.tensor(rows, dtype=torch.long, device=_cache_device(self))
        for mine, theirs in zip(self.layers, source.layers):
            for field in fields(mine):
                getattr(mine, field.name)[index] = getattr(theirs, field.name).to(getattr(mine, field.name).dtype)
        for row in rows:
            self.row_positions[row] = source.position

    def keep_rows(self, rows: list[int]) -> None:
        """Keep only rows `rows` (in that order) of every layer's cache and of the positions."""
        index = torch.tensor(rows, dtype=torch.long, device=_cache_device(self))
        for layer in self.layers:
            for field in fields(layer):
                setattr(layer, field.name, getattr(layer, field.name).index_select(0, index))
        if self.row_positions is not None:
            self.row_positions = [self.row_positions[row] for row in rows]


def _cache_device(cache: DecodeCache) -> torch.device:
    first = cache.layers[0]
    return getattr(first, fields(first)[0].name).device


class Transformer(nn.Module):
    def __init__(self, config: ModelConfig, kernel_backend: str | None = None, *, init_seed: int | None = None):
        """`kernel_backend` is a runtime choice (see hymo_core.kernels), not part of the config.

        Built on the meta device, then materialised on the ambient default device (the CPU unless a
        `torch.device(...)` context says otherwise; under "meta" it stays there: `models.init.build_on_meta`).
        `init_seed` fixes the initial weights; by default it is one draw from torch's global generator.
        """
        super().__init__()
        self.config = config
        self.kernel_backend = kernel_backend
        self.init_seed = draw_init_seed() if init_seed is None else init_seed
        target = torch.empty(0).device
        with torch.device("meta"):
            self.tok_embeddings = nn.Embedding(config.vocab_size, config.d_model)
            self.layers = nn.ModuleList(Block(config, kind, kernel_backend) for kind in config.layer_kinds())
            self.norm = RMSNorm(config.d_model, config.norm_eps, kernel_backend)
            self.output = nn.Linear(config.d_model, config.vocab_size, bias=False)
            self.tie_weights_()
            self.mtp = None
            if config.mtp_depth:
                # DeepSeek-V3: each depth's block is of the trunk's kind, here the last layer's (MLA in HyMo);
                # its FFN is dense unless config.mtp_moe (seed 000 has MoE on the 8 trunk MLA layers only).
                kind = config.layer_kinds()[-1]
                self.mtp = MultiTokenPrediction(config.d_model, config.mtp_loss_weights[: config.mtp_depth],
                                                lambda: Block(config, kind, kernel_backend, moe=config.mtp_moe),
                                                lambda: RMSNorm(config.d_model, config.norm_eps, kernel_backend))
            # Derived from the config, so not saved: a checkpoint holds only learned state.
            self.register_buffer("rope_cos_TD2", torch.empty(config.max_seq_len, config.rope_dim // 2), persistent=False)
            self.register_buffer("rope_sin_TD2", torch.empty(config.max_seq_len, config.rope_dim // 2), persistent=False)
        self.last_ce: torch.Tensor | None = None
        self.last_lse: torch.Tensor | None = None
        self.last_mtp_ce: list[torch.Tensor] = []
        if target.type != "meta":
            materialise_(self, target)

    # ------------------------------------------------------------ initialisation (models/materialise.py)

    def init_units(self) -> list[tuple[str, nn.Module, Callable[[nn.Module, torch.Generator], None]]]:
        """(name, module, init) in the fixed order whose index seeds each unit's generator."""
        units = [("tok_embeddings", self.tok_embeddings, self._init_plain)]
        units += [(f"layers.{i}", block, self._init_block) for i, block in enumerate(self.layers)]
        units.append(("norm", self.norm, self._init_plain))
        if not self.config.tie_embeddings:  # tied: the embedding unit already set the head
            units.append(("output", self.output, self._init_plain))
        if self.mtp is not None:
            units += [(f"mtp.depths.{k}", depth, self._init_mtp_depth) for k, depth in enumerate(self.mtp.depths)]
        if self.config.parametrisation == "mup":
            units = [(name, unit, self._mup_init(name, init)) for name, unit, init in units]
        return units

    def _mup_init(self, unit_name: str, init: Callable[[nn.Module, torch.Generator], None]) -> Callable:
        """The unit's standard init, then muP's per-role std factor (hymo_core/models/mup.py) on each parameter.

        A deterministic rescale inside the unit's init, so meta-device materialisation still equals eager init.
        """
        def scaled(unit: nn.Module, generator: torch.Generator) -> None:
            init(unit, generator)
            for name, param in unit.named_parameters():
                factor = init_multiplier(self.config, width_role(f"{unit_name}.{name}", param.ndim))
                if factor != 1.0:
                    param.mul_(factor)

        return scaled

    def _init_plain(self, unit: nn.Module, generator: torch.Generator) -> None:
        for module in unit.modules():
            if isinstance(module, (nn.Linear, nn.Embedding)):
                nn.init.normal_(module.weight, std=self.config.init_std, generator=generator)
            elif isinstance(module, RMSNorm):
                nn.init.ones_(module.weight)

    def _init_block(self, block: Block, generator: torch.Generator) -> None:
        self._init_plain(block, generator)
        # Each layer adds two residual branches; scaling their output projections by
        # 1/sqrt(2L) keeps the stream's variance roughly depth-independent at init.
        std = residual_std(self.config.init_std, self.config.n_layers)
        for part in (block.attn, block.ffn):
            for weight in part.residual_weights():
                nn.init.normal_(weight, std=std, generator=generator)
            if hasattr(part, "init_extra_parameters"):  # e.g. GDN's decay and conv, MoE's stacked experts
                part.init_extra_parameters(generator)

    def _init_mtp_depth(self, depth: nn.Module, generator: torch.Generator) -> None:
        self._init_plain(depth, generator)
        self._init_block(depth.block, generator)

    def tie_weights_(self) -> None:
        """The head shares the embedding matrix when the config ties them (again after `to_empty`)."""
        if self.config.tie_embeddings:
            self.output.weight = self.tok_embeddings.weight

    @torch.no_grad()
    def init_buffers_(self) -> None:
        """Buffers a fresh model starts from: the RoPE tables (from the config) and MoE balancing state."""
        cos_TD2, sin_TD2 = kernels.rope_tables(self.config.max_seq_len, self.config.rope_dim, self.config.rope_base,
                                               device="cpu", position_scale=self.config.rope_position_scale)
        self.rope_cos_TD2.copy_(cos_TD2)
        self.rope_sin_TD2.copy_(sin_TD2)
        for _, moe in self.moe_layers():
            moe.reset_buffers()

    @torch.no_grad()
    def reset_parameters(self) -> None:
        """Re-initialise in place, on the current device, exactly as at construction."""
        initialise_(self)

    def forward(
        self, tokens_BT: torch.Tensor, targets_BT: torch.Tensor | None = None, cache: DecodeCache | None = None,
        *, return_logits: bool = False,
    ) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """(logits, loss). Without targets: the logits, loss None. With targets: the loss, logits None, the
        output projection fused into the loss chunk by chunk (`training_loss`; the full logits never exist),
        unless `return_logits`: then the logits too, and the loss computed from them (the same value).
        With a `cache`, tokens continue it (per row, see DecodeCache)."""
        B, T = tokens_BT.shape
        start = cache.position if cache is not None else 0
        rows = None
        if cache is not None and cache.row_positions is not None:
            if T != 1 or B != len(cache.row_positions):
                raise ValueError(f"a per-row cache of {len(cache.row_positions)} rows takes one token per row, got {B} x {T}")
            start = max(cache.row_positions)
            rows = RowPositions.of(cache.row_positions, self.rope_cos_TD2, self.rope_sin_TD2)
        if start + T > self.config.max_seq_len:
            raise ValueError(f"sequence length {start + T} exceeds max_seq_len {self.config.max_seq_len}")
        x_BTD = self.tok_embeddings(tokens_BT)
        for i, block in enumerate(self.layers):
            ctx = MixerContext(self.rope_cos_TD2, self.rope_sin_TD2, start, cache.layers[i] if cache is not None else None, rows)
            x_BTD = block(x_BTD, ctx)
        if rows is not None:
            cache.row_positions = [position + 1 for position in cache.row_positions]
        elif cache is not None:
            cache.position += T
        if targets_BT is None:
            return self.head(self.norm(x_BTD)), None
        logits_BTV = None
        if return_logits:
            logits_BTV = self.head(self.norm(x_BTD))
            loss, ce = kernels.cross_entropy_loss(logits_BTV.reshape(B * T, -1), targets_BT.reshape(B * T),
                                                  z_loss=self.config.z_loss, backend=self.kernel_backend)
            lse = torch.logsumexp(logits_BTV.detach().float(), dim=-1).reshape(-1)
        else:
            loss, ce, lse = self._next_token_loss(x_BTD, targets_BT)
        self.last_ce = ce.detach()
        self.last_lse = lse  # the trunk head's log-partition per row: the monitor's log-Z (no host read here)
        if self.training:
            extra = self._training_extras(x_BTD, targets_BT)
            if extra is not None:
                # Only when there is one: `loss + zeros` beside `last_ce = ce.detach()` made Inductor hand back a
                # loss without a gradient (whole-model torch.compile, issue 53).
                loss = loss + extra
        return logits_BTV, loss

    def _next_token_loss(self, hidden_BTD: torch.Tensor, targets_BT: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(objective, cross-entropy, log-partition per row) of the final hidden state: final norm, then the head
        fused into the loss."""
        normed_ND = self.norm(hidden_BTD).reshape(-1, hidden_BTD.shape[-1])
        return kernels.linear_cross_entropy(normed_ND, self.output.weight, targets_BT.reshape(-1),
                                            z_loss=self.config.z_loss, multiplier=output_multiplier(self.config),
                                            backend=self.kernel_backend)

    def training_loss(self, hidden_BTD: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor:
        """The next-token objective of a final hidden state (before the final norm), as `forward` computes it."""
        return self._next_token_loss(hidden_BTD, targets_BT)[0]

    def head(self, hidden_BTD: torch.Tensor) -> torch.Tensor:
        """Logits of normed hidden states: the output projection, times muP's output multiplier (1 when standard)."""
        logits_BTV = self.output(hidden_BTD)
        multiplier = output_multiplier(self.config)
        return logits_BTV * multiplier if multiplier != 1.0 else logits_BTV

    def _training_extras(self, hidden_BTD: torch.Tensor, targets_BT: torch.Tensor) -> torch.Tensor | None:
        """MTP's weighted CEs and the MoE layers' auxiliary losses of this forward (None when neither is on)."""
        extra = None
        if self.mtp is not None:
            ctx = MixerContext(self.rope_cos_TD2, self.rope_sin_TD2)
            mtp_loss, per_depth = self.mtp(
                hidden_BTD, targets_BT, self.tok_embeddings,
                # Each depth's head fused into its loss, as the main head's (no depth holds its full logits).
                lambda hidden_ND, targets_N: kernels.linear_cross_entropy(
                    hidden_ND, self.output.weight, targets_N, multiplier=output_multiplier(self.config),
                    backend=self.kernel_backend)[0],
                lambda block, x_BTD: block(x_BTD, ctx))
            self.last_mtp_ce = [ce.detach() for ce in per_depth]
            extra = mtp_loss
        for _, moe in self.moe_layers():
            if moe.aux_loss is not None:
                extra = moe.aux_loss if extra is None else extra + moe.aux_loss
        return extra

    def blocks(self) -> list[Block]:
        """The trunk's blocks, then MTP's (one per depth)."""
        return list(self.layers) + ([depth.block for depth in self.mtp.depths] if self.mtp is not None else [])

    def moe_layers(self) -> list[tuple[str, MoE]]:
        """(name, module) of every MoE FFN, trunk and MTP, e.g. ("layers.3.ffn", ...)."""
        return [(name, module) for name, module in self.named_modules() if isinstance(module, MoE)]

    def new_cache(self, batch_size: int, device: torch.device | str | None = None,
                  dtype: torch.dtype | None = None, per_row: bool = False) -> DecodeCache:
        """Empty per-layer caches for incremental generation (see layers/__init__.py); `per_row`: every row at position 0
        and decoding at its own position from then on."""
        param = self.tok_embeddings.weight
        device, dtype = device or param.device, dtype or param.dtype
        layers = [block.attn.new_cache(batch_size, torch.device(device), dtype) for block in self.layers]
        return DecodeCache(layers, row_positions=[0] * batch_size if per_row else None)

    def after_optimizer_step(self, reduce: Reduce | None = None, read: bool = True) -> dict[str, dict]:
        """Called by the trainer once per successful update: per-block bookkeeping.

        MoE layers take their gate-bias step from the update's token counts (summed over
        data-parallel ranks by `reduce`, one collective for all layers); returns their load
        figures by layer name (with `read=False`, {}: nothing is read back to the host).
        """
        for block in self.blocks():
            for part in (block.attn, block.ffn):
                hook = getattr(part, "after_optimizer_step", None)
                if hook is not None:
                    hook()
        return moe_after_optimizer_step(self.moe_layers(), reduce, read)

    def discard_routing_counts(self) -> None:
        """An attempted update that was skipped (fp16 overflow): its MoE counts must not move a bias."""
        for _, moe in self.moe_layers():
            moe.discard_counts()

    def softmax_mixers(self) -> list[nn.Module]:
        """Every softmax-attention mixer, trunk in depth order then MTP's: what the probe and QK-Clip act on.

        MTP's blocks (MLA in HyMo) train on NorMuon like the trunk's, so their logits can grow the
        same way; their probe fills in training forwards, the only ones that run MTP.
        """
        return [block.attn for block in self.blocks() if block.is_softmax]

    def set_attention_probe(self, enabled: bool, skip_below: float | None = None) -> None:
        """`skip_below`: heads whose maxima stay at or under this logit may report any value up to it (the probe
        then skips the query blocks a norm bound clears: QK-Clip's threshold on steps that are not logged)."""
        for attn in self.softmax_mixers():
            attn.probe = enabled
            attn.probe_skip_below = skip_below
            if not enabled:
                attn.max_logit_H = None

    def attention_max_logits(self) -> torch.Tensor:
        """(softmax layers, n_heads) maxima from the last probed forward."""
        maxima = [attn.max_logit_H for attn in self.softmax_mixers()]
        if not maxima:  # a stack without softmax attention has nothing to clip
            return torch.zeros(0, self.config.n_heads, device=self.tok_embeddings.weight.device)
        if any(m is None for m in maxima):
            raise RuntimeError("no probe data: call set_attention_probe(True) and run a forward "
                               "(a training forward, when the model has MTP blocks)")
        return torch.stack(maxima)
