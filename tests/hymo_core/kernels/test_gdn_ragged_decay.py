"""Gated DeltaNet with a ragged last chunk and a strong decay: finite, and equal to the recurrent oracle.

T = 100 is one full chunk of 64 and a tail of 36 padded to 64. With g = -3 per token the in-chunk
cumulative gate reaches -108 in the tail, past fp32's exp overflow (88.7): a padded row that reads
its gate as 0 against a real one at -108 asks for exp(108) = inf, and inf x 0 (its zero q, k or
beta) is NaN, which a dot then spreads into the real rows. fla masks such exponents (`safe_exp`);
the kernels here keep the padded rows out of every decay factor. Both chunked backends, the Triton
kernels (under the interpreter without a GPU) and the chunked PyTorch path, must give finite outputs
and gradients equal to the token-by-token oracle's.
"""

import pytest
import torch

pytest.importorskip("triton")

from interpreter_child import RUN_HERE, run_module_in_interpreter  # noqa: E402

NAMES = ["o", "final_state", "dq", "dk", "dv", "dg", "dbeta", "dh0"]


@pytest.mark.skipif(RUN_HERE, reason="kernels run in this process")
def test_ragged_decay_under_triton_interpreter_in_a_child_process():
    run_module_in_interpreter(__file__)


@pytest.fixture(scope="module")
def device():
    if not RUN_HERE:
        pytest.skip("run by test_ragged_decay_under_triton_interpreter_in_a_child_process")
    return "cuda" if torch.cuda.is_available() else "cpu"


def strong_decay_inputs(device, T=100, log_decay=-3.0):
    from test_gdn import gdn_inputs

    q, k, v, _, beta, h0 = gdn_inputs(1, T, 2, 16, 16)
    g = torch.full((1, T, 2), log_decay)
    return [x.to(device) for x in (q, k, v, g, beta, h0)]


@pytest.mark.parametrize("backend", ["triton", "reference"])
def test_ragged_chunk_with_strong_decay_is_finite_and_exact(device, backend):
    from test_gdn import assert_agree, run

    inputs = strong_decay_inputs(device)
    got = run(backend, inputs)
    nonfinite = {name: int((~x.isfinite()).sum()) for name, x in zip(NAMES, got)}
    assert not any(nonfinite.values()), f"{backend}: non-finite elements {nonfinite}"
    assert_agree(got, run("recurrent", inputs), 1e-4)


def test_the_inputs_do_overflow_a_padded_row(device):
    """The case is the one described: the tail's cumulative gate passes exp's fp32 range."""
    *_, g, _, _ = strong_decay_inputs(device)
    tail = g[0, 64:, 0].float().cumsum(0)
    assert float(-tail[-1]) > 88.73 and torch.isinf(torch.exp(-tail[-1]))
