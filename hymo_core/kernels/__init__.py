"""Hot elementwise, normalisation and loss kernels, each with a PyTorch reference.

Every op takes `backend=None|"auto"|"triton"|"reference"`; see `backend.py`
for the dispatch rule (CUDA -> Triton, CPU -> reference, `HYMO_KERNELS`
overrides). Importing this package never requires Triton. The GDN op (gdn.py) keeps its three forms
side by side: recurrent reference, chunked PyTorch, chunked Triton (gdn_triton*.py). Every kernel is a
torch.library custom op (`hymo::...`) with a fake implementation and an autograd rule, so
torch.compile keeps it as one node; the op's CPU body is the PyTorch reference. aot.py compiles every
kernel for sm_90 / sm_80 without a GPU and reports what a block costs.

May import: nothing else of HyMo (layers call kernels, never the reverse).
"""

from hymo_core.kernels.backend import BACKENDS, HAVE_TRITON, resolve_backend
from hymo_core.kernels.cross_entropy import cross_entropy_loss, cross_entropy_rows
from hymo_core.kernels.linear_cross_entropy import linear_cross_entropy
from hymo_core.kernels.norm import rms_norm
from hymo_core.kernels.rotary import apply_rope, rope_tables
from hymo_core.kernels.activation import swiglu

__all__ = [
    "BACKENDS",
    "HAVE_TRITON",
    "apply_rope",
    "cross_entropy_loss",
    "cross_entropy_rows",
    "linear_cross_entropy",
    "resolve_backend",
    "rms_norm",
    "rope_tables",
    "swiglu",
]
