"""The MTP heads' loss without full logits (issue 54): each depth's head goes through the fused, chunked
`kernels.linear_cross_entropy` as the main head does (its values and gradients against the full-logits loss are
tests/hymo_core/models/test_step_traffic.py's). At hymo-750m's shapes on the meta device no tensor of MTP's
forward + backward is as large as one head's full logits (8,190 x 64,256), where the old path made one per depth.
"""
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LargestTensor(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        flat, _ = tree_flatten(out)
        self.largest = max([self.largest] + [t.numel() for t in flat if isinstance(t, torch.Tensor)])
        return out


def test_mtp_loss_never_holds_a_full_logits_tensor():
    from hymo_core.train.block_budget import meta_model

    model = meta_model()
    tokens = torch.zeros(2, 4096, dtype=torch.long, device="meta")
    hidden = torch.empty(2, 4096, model.config.d_model, device="meta", dtype=torch.bfloat16, requires_grad=True)
    with LargestTensor() as mode:
        loss = model._training_extras(hidden, tokens)
        loss.backward()
    full_logits = 2 * (4096 - 1) * model.config.vocab_size
    assert mode.largest < full_logits, (mode.largest, full_logits)
