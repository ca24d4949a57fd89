"""Counting the kernels a piece of training code would launch, and the bytes they move, on any device.

Most of a small model's missing GPU time is launches and host work, not matmuls. A `TorchDispatchMode`
sees every aten call and every custom op (`hymo::*`) at the level a device would run them, so the
count is the same on the meta device (real preset shapes, no memory), on the CPU and on a GPU:

* an op launches one kernel unless it only makes a view or an allocation (`NO_KERNEL_OPS`, and every
  op whose schema says its result aliases an input without writing it: `view`, `slice`, `transpose`...);
* a custom op is one launch under its own name; the aten calls inside its body are not counted
  (on the GPU they are a Triton kernel, or a few: the kernels' own tests hold those);
* a `_foreach_*` op is one launch per `FOREACH_TENSORS_PER_LAUNCH` tensors, as CUDA's
  multi_tensor_apply packs them;
* bytes are what each launch reads (tensor inputs) and writes (tensor outputs), a traffic estimate for
  the roofline, not an allocator figure;
* `noncontiguous` counts, per custom op, the strided tensor inputs it was handed: each is a copy its
  body makes (or a kernel that must take strides), the traffic issue 53 removes around `hymo::*`.

`PeakBytes` is the memory side: the most bytes of tensor storage alive at once while it is entered
(on meta too, where nothing is allocated), e.g. to show a loss never holds the full logits.

    counter = LaunchCounter()
    with counter, counter.phase("forward"):
        loss = model(tokens)
    with counter, counter.phase("backward"):
        loss.backward()
    counter.launches("forward"), counter.top(10)

`phase` tags what follows; everything counted outside a phase lands in "other".

Attention on the meta device or the CPU would decompose into the math backend (bmm, softmax, masks);
with `sdpa_as_flash` (the default) a causal, maskless `F.scaled_dot_product_attention` call runs as
`aten._scaled_dot_product_flash_attention` instead, one kernel forward and one backward, as on the GPU
(`aten._scaled_dot_product_cudnn_attention` where v is narrower than q and k, as MLA's call runs on sm_90).
"""
from __future__ import annotations

import contextlib
import math
import weakref
from collections import Counter
from dataclasses import dataclass, field

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from hymo_core.train.host_sync import _overloads, _run_custom_op

aten = torch.ops.aten

# Allocations and metadata: the device runs nothing for these (a fill is counted: zeros, full, fill_).
NO_KERNEL_OPS = _overloads(
    "empty.memory_format", "empty_strided", "empty_like", "new_empty", "new_empty_strided", "lift_fresh",
    "lift_fresh_copy", "detach", "alias", "sym_size.int", "sym_stride.int", "sym_numel", "sym_storage_offset",
    "_local_scalar_dense", "set_.source_Storage_storage_offset", "resize_", "_unsafe_view", "_reshape_alias",
    "view_as_real", "view_as_complex")
# CUDA's multi_tensor_apply: one launch carries up to this many tensors (depth-1 lists: 110; 48-64 for more lists).
FOREACH_TENSORS_PER_LAUNCH = 48


def is_view(func) -> bool:
    """True when every result aliases an input without writing it (view, slice, transpose, expand...)."""
    returns = func._schema.returns
    return bool(returns) and all(r.alias_info is not None and not r.alias_info.is_write for r in returns)


def _tensor_bytes(values) -> int:
    flat, _ = tree_flatten(values)
    return sum(t.numel() * t.element_size() for t in flat if isinstance(t, torch.Tensor))


def launches_of(func, args) -> int:
    """Kernel launches a device makes for this call."""
    if func in NO_KERNEL_OPS or is_view(func):
        return 0
    name = func.__name__ if hasattr(func, "__name__") else str(func)
    if name.startswith("_foreach_"):
        tensors = max((len(a) for a in args if isinstance(a, (list, tuple))), default=1)
        return max(1, math.ceil(tensors / FOREACH_TENSORS_PER_LAUNCH))
    return 1


@dataclass
class PhaseCount:
    launches: Counter = field(default_factory=Counter)  # op name -> launches
    calls: Counter = field(default_factory=Counter)  # op name -> calls that launch (a foreach call is one, whatever its list)
    bytes_by_op: Counter = field(default_factory=Counter)  # op name -> bytes read + written
    bytes_read: int = 0
    bytes_written: int = 0
    noncontiguous: Counter = field(default_factory=Counter)  # custom op name -> strided tensor inputs

    @property
    def total(self) -> int:
        return sum(self.launches.values())


class _Mode(TorchDispatchMode):
    def __init__(self, counter: "LaunchCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        custom = func.namespace != "aten"
        out = _run_custom_op(func, args, kwargs) if custom else func(*args, **kwargs)
        n = 1 if custom else launches_of(func, args)
        if n:
            count = self.counter.phases.setdefault(self.counter.current, PhaseCount())
            name = str(func) if custom else str(func.overloadpacket)
            read, written = _tensor_bytes((args, kwargs)), _tensor_bytes(out)
            count.launches[name] += n
            count.calls[name] += 1
            count.bytes_by_op[name] += read + written
            count.bytes_read += read
            count.bytes_written += written
            if custom:
                flat, _ = tree_flatten((args, kwargs))
                strided = sum(1 for t in flat if isinstance(t, torch.Tensor) and not t.is_contiguous())
                if strided:
                    count.noncontiguous[name] += strided
        return out


class _FlashAttention(TorchFunctionMode):
    """`F.scaled_dot_product_attention` as the flash kernel, where the flash kernel takes the call."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is torch.nn.functional.scaled_dot_product_attention:
            flash = _as_flash(*args, **kwargs)
            if flash is not None:
                return flash
        return func(*args, **kwargs)


def _as_flash(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    if attn_mask is not None or (enable_gqa and query.shape[-3] != key.shape[-3]):
        return None
    if value.shape[-1] != query.shape[-1]:  # flash wants one head width: cuDNN's kernel takes these (MLA on sm_90)
        return aten._scaled_dot_product_cudnn_attention(query, key, value, None, True, dropout_p, is_causal, False,
                                                        scale=scale)[0]
    return aten._scaled_dot_product_flash_attention(query, key, value, dropout_p, is_causal, False, scale=scale)[0]


class LaunchCounter:
    """Context manager counting kernel launches and bytes per phase (`phases[name]`)."""

    def __init__(self, *, sdpa_as_flash: bool = True):
        self.phases: dict[str, PhaseCount] = {}
        self.current = "other"
        self._modes: list = []
        self.sdpa_as_flash = sdpa_as_flash

    def __enter__(self) -> "LaunchCounter":
        self._modes = ([_FlashAttention()] if self.sdpa_as_flash else []) + [_Mode(self)]
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        self._modes = []

    @contextlib.contextmanager
    def phase(self, name: str):
        previous, self.current = self.current, name
        try:
            yield self
        finally:
            self.current = previous

    def launches(self, phase: str | None = None) -> int:
        """Launches in one phase, or in all of them."""
        if phase is not None:
            return self.phases.get(phase, PhaseCount()).total
        return sum(p.total for p in self.phases.values())

    def calls(self, phase: str | None = None) -> int:
        """Launching op calls in one phase, or in all: what the host dispatches. Launches minus calls is what
        foreach lists longer than one launch's tensors add (a count that grows with the tensors, not the code)."""
        chosen = [self.phases.get(phase, PhaseCount())] if phase is not None else list(self.phases.values())
        return sum(sum(p.calls.values()) for p in chosen)

    def bytes_moved(self, phase: str | None = None) -> int:
        chosen = [self.phases.get(phase, PhaseCount())] if phase is not None else list(self.phases.values())
        return sum(p.bytes_read + p.bytes_written for p in chosen)

    def top(self, n: int = 10, phase: str | None = None) -> list[tuple[str, int]]:
        merged = Counter()
        for name, count in self.phases.items():
            if phase is None or name == phase:
                merged.update(count.launches)
        return merged.most_common(n)

    def noncontiguous_inputs(self, phase: str | None = None) -> Counter:
        """Strided tensor inputs handed to custom ops, by op (one phase or all)."""
        merged = Counter()
        for name, count in self.phases.items():
            if phase is None or name == phase:
                merged.update(count.noncontiguous)
        return merged

    def summary(self) -> dict:
        """JSON-ready: per phase, launches, bytes read and written, and the ten most launched ops."""
        return {name: {"launches": p.total, "calls": sum(p.calls.values()), "bytes_read": p.bytes_read, "bytes_written": p.bytes_written,
                       "top": p.launches.most_common(10)} for name, p in self.phases.items()}


class PeakBytes(TorchDispatchMode):
    """The most bytes of tensor storage alive at once while entered (`peak`), counted from each op's outputs.

    Storage made before entering is not counted (`peak` is what the code inside adds). A storage is counted
    once however many views share it and leaves the count when its last tensor dies (a weakref finaliser).
    Custom ops count their outputs only: their bodies' temporaries run below the mode.
    """

    def __init__(self):
        super().__init__()
        self.live = 0
        self.peak = 0
        self._seen: set[int] = set()

    def _forget(self, key: int, nbytes: int) -> None:
        self._seen.discard(key)
        self.live -= nbytes

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        out = _run_custom_op(func, args, kwargs) if func.namespace != "aten" else func(*args, **kwargs)
        flat, _ = tree_flatten(out)
        for tensor in flat:
            if not isinstance(tensor, torch.Tensor):
                continue
            storage = tensor.untyped_storage()
            key = id(storage)
            if key in self._seen:
                continue
            self._seen.add(key)
            self.live += storage.nbytes()
            weakref.finalize(storage, self._forget, key, storage.nbytes())
        self.peak = max(self.peak, self.live)
        return out
