"""How a model built on the meta device gets its storage and initial values (API: models/init.py).

Initialisation is cut into units (the embedding, each trunk block, the final norm, the head, each
MTP depth). Each unit draws its values from its own CPU generator, seeded by (the model's init
seed, the unit's index), so a unit's values depend on nothing else: a rank that holds a shard of
block 7 computes block 7's full values and keeps its slice (`distribute_tensor(..., src_data_rank=
None)`: no communication), and the result is the same at every world size and sharding. Eager
`Transformer(config)` is built the same way (on meta, then materialised on its device), so a
materialised model equals an eager one under the same `torch.manual_seed`, bit for bit.

A model taking part provides `init_seed`, `init_units()` -> [(name, module, init(module,
generator))], `tie_weights_()` and `init_buffers_()` (hymo_core/models/model.py).
Extra host memory while materialising: one unit's full values (the embedding is the largest).
"""
from __future__ import annotations

import math
from collections.abc import Iterator

import torch
import torch.nn as nn

try:  # FSDP2 shards parameters as DTensors
    from torch.distributed.tensor import DTensor, distribute_tensor
except ImportError:  # pragma: no cover - torch built without distributed
    DTensor = None

UNIT_SEED_STRIDE = 1_000_003  # a prime: unit seeds of neighbouring init seeds do not collide


def draw_init_seed() -> int:
    """One draw from torch's global CPU generator: what `torch.manual_seed` fixes for a model's init."""
    return int(torch.randint(0, 2**62, (1,), device="cpu").item())


def unit_generator(init_seed: int, index: int) -> torch.Generator:
    return torch.Generator(device="cpu").manual_seed((init_seed * UNIT_SEED_STRIDE + index) % 2**63)


def _unit_parameters(unit: nn.Module) -> Iterator[tuple[nn.Module, str, nn.Parameter]]:
    for module in unit.modules():
        for name, param in module._parameters.items():
            if param is not None:
                yield module, name, param


@torch.no_grad()
def materialise_unit_(unit: nn.Module, init, generator: torch.Generator, device: torch.device) -> None:
    """Run `init(unit, generator)` on full CPU stand-ins of the unit's parameters, then copy them in.

    A plain parameter receives the whole value; a DTensor keeps its local shard of it. The unit's
    own parameter objects are put back (FSDP holds references to them).
    """
    originals = list(_unit_parameters(unit))
    stand_ins: dict[int, nn.Parameter] = {}
    for module, name, param in originals:
        if id(param) not in stand_ins:
            stand_ins[id(param)] = nn.Parameter(torch.empty(param.shape, dtype=param.dtype, device="cpu"),
                                                requires_grad=param.requires_grad)
        module._parameters[name] = stand_ins[id(param)]
    try:
        init(unit, generator)
    finally:
        for module, name, param in originals:
            module._parameters[name] = param
    done: set[int] = set()
    for _, _, param in originals:
        if id(param) in done:
            continue
        done.add(id(param))
        full = stand_ins[id(param)].data
        if DTensor is not None and isinstance(param, DTensor):
            local = distribute_tensor(full.to(param.device), param.device_mesh, param.placements, src_data_rank=None)
            param.to_local().copy_(local.to_local())
        else:
            param.copy_(full.to(device))


@torch.no_grad()
def materialise_(model: nn.Module, device: torch.device | str, *, seed: int | None = None) -> nn.Module:
    """Allocate `model`'s storage on `device` (this rank's shards, if sharded) and initialise it, unit by unit.

    `seed` overrides the init seed the model was built with. Returns the model.
    """
    device = torch.device(device)
    init_seed = model.init_seed if seed is None else seed
    model.init_seed = init_seed
    model.to_empty(device=device)
    model.tie_weights_()  # to_empty gives every module its own new tensor, which unties shared weights
    return initialise_(model)


@torch.no_grad()
def initialise_(model: nn.Module) -> nn.Module:
    """Initialise allocated storage in place, unit by unit, from the model's init seed."""
    device = model.rope_cos_TD2.device
    for index, (_, unit, init) in enumerate(model.init_units()):
        materialise_unit_(unit, init, unit_generator(model.init_seed, index), device)
    model.init_buffers_()
    return model


def residual_std(std: float, n_layers: int) -> float:
    """Each layer adds two residual branches: 1/sqrt(2L) keeps the stream's variance depth-independent at init."""
    return std / math.sqrt(2 * n_layers)
