"""The launch counter: views and allocations launch nothing, a foreach op launches per 48 tensors, a custom op
once, and the meta device's attention counts as the flash kernel, not the math backend's bmm and softmax."""
import torch
import torch.nn.functional as F

from hymo_core.kernels.norm import rms_norm
from hymo_core.train.launch_count import FOREACH_TENSORS_PER_LAUNCH, LaunchCounter


def test_views_and_allocations_launch_nothing():
    x = torch.randn(4, 6, device="meta")
    with LaunchCounter() as counter:
        y = x.view(6, 4).t().contiguous()  # a view, a view, then one copy
        torch.empty(10, device="meta")
        (y * 2).sum()
    assert counter.top() == [("aten.clone", 1), ("aten.mul", 1), ("aten.sum", 1)]
    assert counter.launches() == 3


def test_foreach_is_one_launch_per_chunk_and_custom_op_once():
    params = [torch.randn(3, device="meta") for _ in range(FOREACH_TENSORS_PER_LAUNCH + 1)]
    x, w = torch.randn(2, 8, device="meta"), torch.ones(8, device="meta")
    with LaunchCounter() as counter:
        with counter.phase("optimizer"):
            torch._foreach_mul_(params, 0.5)
        with counter.phase("forward"):
            rms_norm(x, w, 1e-6)
    assert counter.launches("optimizer") == 2
    assert counter.launches("forward") == 1, counter.top()
    assert counter.phases["forward"].bytes_written == 2 * 8 * 4 + 2 * 4  # y and the saved rstd


def test_meta_attention_counts_as_flash():
    q = torch.randn(2, 4, 128, 64, device="meta", requires_grad=True)
    with LaunchCounter() as counter:
        with counter.phase("forward"):
            out = F.scaled_dot_product_attention(q, q, q, is_causal=True)
        with counter.phase("backward"):
            out.sum().backward()
    assert [op for op, _ in counter.top(phase="forward")] == ["aten._scaled_dot_product_flash_attention"]
    assert "aten._scaled_dot_product_flash_attention_backward" in dict(counter.top(phase="backward"))
    with LaunchCounter(sdpa_as_flash=False) as math:
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
    assert math.launches() > 2
