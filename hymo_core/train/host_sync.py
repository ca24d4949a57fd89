"""Counting the host syncs a piece of training code makes, at the level torch dispatches them.

A host sync is any point where the CPU must wait for the device's values. Patching `Tensor.item`
and friends in Python misses the ones made inside torch's C++ code: `torch.nonzero`, a boolean-mask
index `x[mask]`, `masked_select`, `unique`, `bincount` and `repeat_interleave` without `output_size`
size their output from the data, so on CUDA they copy a count back before returning. Here a
`TorchDispatchMode` sees every aten call, and counts:

* `aten._local_scalar_dense` (`item`, `float()`, `int()`, `bool()`, `if tensor:`);
* ops whose output shape depends on the data (`DATA_DEPENDENT_OPS`), an index / index_put with a
  boolean index, and `repeat_interleave` with tensor repeats unless `output_size` is given;
* `aten.equal` (a bool on the host) and copies from a CUDA tensor to the CPU.

Custom ops (the kernels) are counted as calls but their bodies run outside the mode (`_run_custom_op`).
`Tensor.tolist` and `Tensor.numpy` read a CPU tensor without any aten call, so they are patched
in Python as well. `torch.cuda.set_sync_debug_mode("error")` is the device-side check of the same
property; this counter works on the CPU, where tests run.

    with HostSyncCounter() as syncs:
        step()
    assert syncs.events == [], syncs.events

`counting` may be switched off and on inside the block (e.g. only between two optimizer steps).
"""
from __future__ import annotations

import traceback
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

aten = torch.ops.aten


def _overloads(*names: str) -> frozenset:
    """The named aten overloads ("op" = its default, "op.overload") that this torch build has."""
    found = []
    for name in names:
        op, _, overload = name.partition(".")
        packet = getattr(aten, op, None)
        if packet is not None and hasattr(packet, overload or "default"):
            found.append(getattr(packet, overload or "default"))
    return frozenset(found)


DATA_DEPENDENT_OPS = _overloads(  # output sized by the values (bincount: by the largest one)
    "nonzero", "masked_select", "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive",
    "bincount")
REPEAT_INTERLEAVE_OPS = _overloads("repeat_interleave.Tensor", "repeat_interleave.self_Tensor")
SCALAR_READ_OPS = _overloads("_local_scalar_dense", "equal")
BOOL_INDEX_OPS = _overloads("index.Tensor", "index_put", "index_put_", "_index_put_impl_")
COPY_OPS = _overloads("_to_copy", "copy_")
PYTHON_READS = ("tolist", "numpy")


@dataclass(frozen=True)
class SyncEvent:
    op: str
    where: str  # the innermost frame outside torch: file:line

    def __str__(self) -> str:
        return f"{self.op} at {self.where}"


def _caller() -> str:
    for frame in reversed(traceback.extract_stack()):
        path = frame.filename.replace("\\", "/")
        if "/torch/" not in path and not path.endswith("/hymo_core/train/host_sync.py"):
            return f"{frame.filename}:{frame.lineno}"
    return "?"


def _has_bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8) for i in indices or ())


def _is_cuda(value) -> bool:
    return isinstance(value, torch.Tensor) and value.device.type == "cuda"


def sync_kind(func, args, kwargs) -> str | None:
    """Why this aten call is a host sync, or None."""
    if func in SCALAR_READ_OPS or func in DATA_DEPENDENT_OPS:
        return str(func)
    if func in BOOL_INDEX_OPS and len(args) > 1 and _has_bool_index(args[1]):
        return f"{func} with a boolean index"
    if func in REPEAT_INTERLEAVE_OPS:
        if kwargs.get("output_size") is None:
            return f"{func} without output_size"
    if func in COPY_OPS:
        if func is aten._to_copy.default and _is_cuda(args[0]):
            device = kwargs.get("device")
            if device is not None and torch.device(device).type == "cpu":
                return f"{func} cuda -> cpu"
        if func is aten.copy_.default and _is_cuda(args[1]) and args[0].device.type == "cpu":
            return f"{func} cuda -> cpu"
    return None


class _Mode(TorchDispatchMode):
    def __init__(self, counter: "HostSyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.counter.counting:
            kind = sync_kind(func, args, kwargs)
            if kind is not None:
                self.counter.events.append(SyncEvent(kind, _caller()))
        if func.namespace != "aten":
            return _run_custom_op(func, args, kwargs)
        return func(*args, **kwargs)


# Keys torch's Python fallback excludes while a mode handles an op. A custom op's CPU body (hymo's kernels:
# the reference backward recomputes through torch.func.vjp) needs functorch's keys back, or its vjp meets
# wrapper tensors at a CPU kernel ("Cannot access data pointer of Tensor that doesn't have storage").
_LIFTED_KEYS = tuple(getattr(torch._C.DispatchKey, name) for name in (
    "FuncTorchDynamicLayerBackMode", "FuncTorchDynamicLayerFrontMode", "FuncTorchGradWrapper", "FuncTorchBatched",
    "FuncTorchVmapMode", "Functionalize", "ADInplaceOrView", "Conjugate", "Negative", "ZeroTensor", "Batched", "VmapMode",
) if hasattr(torch._C.DispatchKey, name))


def _run_custom_op(func, args, kwargs):
    """A non-aten op (a kernel's custom op) run outside the mode with functorch's keys restored; the aten calls
    inside its body are not seen (the kernels' own tests hold them to static shapes)."""
    exclude = torch._C._dispatch_tls_local_exclude_set()
    for key in _LIFTED_KEYS:
        exclude = exclude.remove(key)
    with _disable_current_modes(), torch._C._ForceDispatchKeyGuard(torch._C._dispatch_tls_local_include_set(), exclude):
        return func(*args, **kwargs)


class HostSyncCounter:
    """Context manager recording every host sync (`events`) made while `counting` is true."""

    def __init__(self, counting: bool = True):
        self.counting = counting
        self.events: list[SyncEvent] = []
        self._mode = _Mode(self)
        self._originals: dict[str, object] = {}

    @property
    def count(self) -> int:
        return len(self.events)

    def __enter__(self) -> "HostSyncCounter":
        for name in PYTHON_READS:
            original = getattr(torch.Tensor, name)
            self._originals[name] = original
            setattr(torch.Tensor, name, self._counted(name, original))
        self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._mode.__exit__(*exc)
        for name, original in self._originals.items():
            setattr(torch.Tensor, name, original)
        self._originals.clear()

    def _counted(self, name: str, original):
        counter = self

        def method(tensor, *args, **kwargs):
            if counter.counting:
                counter.events.append(SyncEvent(f"Tensor.{name}", _caller()))
            return original(tensor, *args, **kwargs)

        return method
