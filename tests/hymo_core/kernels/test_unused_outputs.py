"""An op output the caller leaves unused gets no zero-filled gradient, and the backward is right without it (issue 54).

GDN's final state (training never reads it), its G and Tinv (kept for the Triton backward) and RMSNorm's
rstd arrive in the backward as None, not as zeros autograd fills in: at hymo-750m 2 x 4096 that was a
(B, H, K, V) and a (B, T, H, 64) fp32 fill a GDN layer. Counted on the meta device, each op's backward is
its own backward op alone. With either GDN output unused (dht None, or do None) the gradients match the
token-by-token oracle, on the reference body here and on the Triton kernels under TRITON_INTERPRET=1 in
a child pytest.
"""

import pytest
import torch

from interpreter_child import RUN_HERE, run_module_in_interpreter
from test_gdn import gdn_inputs

from hymo_core import kernels
from hymo_core.kernels.gdn import gated_delta_rule
from hymo_core.train.launch_count import LaunchCounter


def meta(*shape):
    return torch.empty(*shape, device="meta", requires_grad=True)


def gdn_output_only():
    B, T, H, K = 2, 128, 2, 16
    return gated_delta_rule(meta(B, T, H, K), meta(B, T, H, K), meta(B, T, H, K), meta(B, T, H), meta(B, T, H),
                            backend="reference")[0]


def rms_norm_output():
    return kernels.rms_norm(meta(3, 5, 16), meta(16), backend="reference")


@pytest.mark.parametrize("forward, backward_op", [(gdn_output_only, "hymo.gated_delta_rule_backward.default"),
                                                  (rms_norm_output, "hymo.rms_norm_backward.default")],
                         ids=["gdn", "rms_norm"])
def test_backward_fills_no_zeros_for_unused_outputs(forward, backward_op):
    out = forward()
    counter = LaunchCounter()
    with counter, counter.phase("backward"):
        out.backward(torch.empty_like(out))
    assert dict(counter.top(10)) == {backward_op: 1}


def gradients(backend, inputs, used):
    """Input gradients of a fixed objective of GDN's output ("o") or its final state ("state"); q, which the state
    does not depend on, gets none from the oracle: zeros."""
    xs = [x.detach().clone().requires_grad_() for x in inputs]
    o, ht = gated_delta_rule(*xs[:5], initial_state_BHKV=xs[5], backend=backend)
    objective = {"o": lambda: o.float().square().sum(),
                 "state": lambda: (ht * torch.linspace(-1, 1, ht.numel()).view_as(ht).to(ht)).sum()}[used]()
    objective.backward()
    return [x.grad.float() if x.grad is not None else torch.zeros_like(x) for x in xs]


def assert_gradients_agree(actual, expected, rel):
    for name, a, e in zip(["dq", "dk", "dv", "dg", "dbeta", "dh0"], actual, expected):
        err = float((a - e).abs().max() / e.abs().max().clamp(min=1e-6))
        assert err <= rel, f"{name}: relative error {err:.2e} > {rel:.0e}"


@pytest.mark.parametrize("used", ["o", "state"])
def test_gdn_reference_gradients_with_one_output_unused(used):
    inputs = gdn_inputs(1, 70, 2, 16, 16)
    assert_gradients_agree(gradients("reference", inputs, used), gradients("recurrent", inputs, used), 1e-4)


@pytest.mark.skipif(RUN_HERE, reason="kernels run in this process")
def test_triton_cases_under_triton_interpreter_in_a_child_process():
    run_module_in_interpreter(__file__)


@pytest.mark.parametrize("used", ["o", "state"])
def test_gdn_triton_gradients_with_one_output_unused(used):
    if not RUN_HERE:
        pytest.skip("run by test_triton_cases_under_triton_interpreter_in_a_child_process")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    inputs = [x.to(device) for x in gdn_inputs(1, 70, 2, 16, 16)]
    assert_gradients_agree(gradients("triton", inputs, used), gradients("recurrent", inputs, used), 1e-4)
