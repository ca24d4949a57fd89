"""The MTP heads' loss without full logits (issue 54): chunked, each chunk's logits recomputed in backward.

Values and gradients equal the full-logits loss (z-loss on and off, ignored targets, a chunk with no valid
target); at hymo-750m's shapes on the meta device no tensor of MTP's forward + backward is as large as one
head's full logits (8,190 x 64,256), where the old path made one per depth.
"""
import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hymo_core import kernels
from hymo_core.models.head_loss import chunked_head_loss


@pytest.mark.parametrize("z_loss", [0.0, 1e-4])
def test_chunked_loss_equals_the_full_logits_loss(z_loss):
    generator = torch.Generator().manual_seed(0)
    head = torch.nn.Linear(16, 37, bias=False).double()
    hidden = torch.randn(23, 16, generator=generator, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 37, (23,), generator=generator)
    targets[5:10] = -100  # rows 5..9: the second chunk of 5 has no valid target
    full = kernels.cross_entropy_loss(head(hidden), targets, z_loss=z_loss)
    grads_full = torch.autograd.grad(full[0], (hidden, head.weight))
    chunked = chunked_head_loss(hidden, head, targets, z_loss=z_loss, chunk_rows=5)
    grads_chunked = torch.autograd.grad(chunked[0], (hidden, head.weight))
    for got, want in zip(chunked + grads_chunked, full + grads_full):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)  # the CE runs in fp32 either way


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
    assert mode.largest < full_logits / 2, (mode.largest, full_logits)
