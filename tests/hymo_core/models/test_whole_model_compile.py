"""The whole dense model compiles as one graph (`torch.compile(model, fullgraph=True)`), and its loss trains.

Issue 53: compiled whole on the CPU, the loss came back without a gradient (`loss + zeros` beside
`last_ce = ce.detach()` made Inductor return the loss as an alias of the detached value), so training
that way would have learned nothing. Here the compiled model's loss, and every parameter's gradient,
equal eager's, with no graph break. Under compile the row and pointwise kernels trace as plain PyTorch
for Inductor to fuse (kernels/backend.py `inductor_generates`); a named backend keeps the custom ops.
The trainer compiles the whole model on one process and per block under torchrun.
"""

import torch
from torch._dynamo.utils import counters

from hymo_core.distributed.parallelize import parallelize
from hymo_core.distributed.process_group import Runtime
from hymo_core.models.model import ModelConfig, Transformer
from hymo_core.train.config import TrainConfig

CONFIG = ModelConfig(vocab_size=97, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=48, max_seq_len=16)  # z_loss 0: the failing case


def loss_and_grads(model, tokens, run=None):
    model.zero_grad(set_to_none=True)
    _, loss = (model if run is None else run)(tokens[:, :-1], tokens[:, 1:])
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


def test_whole_dense_model_compiles_fullgraph_and_its_loss_has_the_eager_gradients():
    torch.manual_seed(0)
    model = Transformer(CONFIG)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 13))
    eager_loss, eager_grads = loss_and_grads(model, tokens)
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(model, fullgraph=True)
    _, loss = compiled(tokens[:, :-1], tokens[:, 1:])
    assert loss.requires_grad, "the compiled model's loss has no gradient"
    compiled_loss, compiled_grads = loss_and_grads(model, tokens, compiled)
    assert sum(counters["graph_break"].values()) == 0, dict(counters["graph_break"])
    torch.testing.assert_close(compiled_loss, eager_loss, rtol=1e-5, atol=1e-6)
    assert compiled_grads.keys() == eager_grads.keys()
    for name, grad in compiled_grads.items():
        torch.testing.assert_close(grad, eager_grads[name], rtol=1e-4, atol=1e-6, msg=name)


def traced_custom_ops(kernel_backend):
    """The hymo:: ops left in the graph Dynamo hands its backend (no Inductor needed to read it)."""
    seen = []

    def backend(gm, example_inputs):
        for module in gm.modules():  # an autograd.Function's forward and backward are subgraphs
            if isinstance(module, torch.fx.GraphModule):
                seen.extend(str(node.target) for node in module.graph.nodes if node.op == "call_function")
        return gm.forward

    torch.manual_seed(0)
    model = Transformer(CONFIG, kernel_backend=kernel_backend)
    tokens = torch.randint(0, CONFIG.vocab_size, (2, 9))
    torch._dynamo.reset()
    torch.compile(model, fullgraph=True, backend=backend)(tokens[:, :-1], tokens[:, 1:])
    return {target for target in seen if target.startswith("hymo.")}


def test_under_compile_the_pointwise_ops_are_plain_torch_for_inductor():
    assert traced_custom_ops(None) == {"hymo.cross_entropy_rows.default", "hymo.cross_entropy_rows_backward.default"}
    named = traced_custom_ops("reference")  # a named backend keeps every custom op
    assert {"hymo.rms_norm.default", "hymo.rope.default", "hymo.swiglu_packed.default"} <= named


def test_the_trainer_compiles_the_whole_model_on_one_process_and_blocks_under_torchrun():
    from hymo_core.distributed.parallelize import compile_scope

    config = TrainConfig(compile=True)
    assert compile_scope(config, Runtime()) == "model"
    assert compile_scope(config, Runtime(launched=True, world_size=2)) == "blocks"  # FSDP2 hooks between blocks
    assert compile_scope(config, Runtime(launched=True, world_size=1)) == "model"  # one rank: no FSDP2 (wraps_in_fsdp)
    assert compile_scope(TrainConfig(compile=True, activation_checkpointing=True), Runtime()) == "blocks"
    assert compile_scope(TrainConfig(compile=True, compile_scope="blocks"), Runtime()) == "blocks"
    model = Transformer(CONFIG)
    keys = list(model.state_dict())
    parallelize(model, Runtime(), config)
    assert model._compiled_call_impl is not None  # the root: one graph
    assert all(block._compiled_call_impl is None for block in model.layers)
    assert list(model.state_dict()) == keys  # checkpoints read the same
