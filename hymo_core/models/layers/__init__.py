"""The blocks both model families are built from: one interface, one module per block kind.

A model is a stack of `Block`s (hymo_core/models/layers/block.py). A block is

    x = x + mixer(attn_norm(x), ctx)        # token mixing: one of the kinds below
    x = x + ffn(ffn_norm(x))                # channel mixing: dense SwiGLU or MoE

with the attribute names `attn_norm`, `attn` (the mixer, whatever its kind), `ffn_norm`, `ffn`,
so parameter names stay `layers.N.attn.*` / `layers.N.ffn.*` and the optimizer partition rules
(hymo_core/train/optim.py, seed 000 §2) match by name.

Mixer kinds, one letter each in `ModelConfig.layer_pattern` (repeated to `n_layers`):
    "A"  GQA softmax attention with RoPE (the dense decoder's)     layers/attention.py
    "G"  Gated DeltaNet (linear attention, recurrent state)        layers/gdn.py
    "M"  Multi-head Latent Attention (DeepSeek-V2)                 layers/mla.py

Mixer contract (layers/context.py, block.py):
    forward(x_BTD, ctx: MixerContext) -> y_BTD
    `ctx` carries the RoPE tables, the absolute position of x's first token, and this layer's
    cache (None in training). A cache is created by `mixer.new_cache(batch_size, device, dtype)`
    and updated in place by forward: KV (A), compressed latent + shared rope key (M), conv tail +
    recurrent state (G). Cached step-by-step forward equals one full forward; the model bundles
    the layers' caches in `model.new_cache(...)` -> DecodeCache and `model(tokens, cache=...)`.
    Softmax mixers (A, M) expose `probe` / `max_logit_H` (the attention-logit probe QK-Clip and
    logging read) and `qk_clip_(scale_H)`, which rescales that mixer's query/key weights per head
    (scale_H[h] <= 1; 1 leaves the head alone); `model.softmax_mixers()` lists them, MTP's included.
    Every mixer and FFN has `residual_weights()` (the weights that write into the residual
    stream; the model initialises them with std / sqrt(2 L)) and may have
    `init_extra_parameters(generator)` for parameters that are neither Linear/Embedding (normal(std))
    nor RMSNorm gains (ones), e.g. GDN's A_log, dt_bias and conv.

FFN kinds, chosen per mixer kind by `ModelConfig.moe_on` (e.g. "M": MoE on MLA layers):
    FeedForward   dense SwiGLU                                       layers/ffn.py
    MoE           DeepSeekMoE: routed + shared experts, gate bias     layers/moe.py
    Both are built as `Kind(config: ModelConfig, kernel_backend)`.
    forward(x_BTD) -> y_BTD. An MoE also counts tokens per expert across the micro-batches of
    an optimizer update (a buffer, no grad) and holds its optional auxiliary loss of the last
    forward; the model adds aux losses to the loss, and the trainer calls
    `model.after_optimizer_step()` once per successful update, which calls
    `after_optimizer_step()` on every mixer and FFN that has one (gate-bias step, counters reset).

Multi-token prediction (layers/mtp.py) hangs off the model, not a block: it is dropped for
generation and evaluation, and its per-depth losses are in `model.last_mtp_ce`.

May import: `hymo_core.kernels`, `hymo_core.models.configs`.
"""
