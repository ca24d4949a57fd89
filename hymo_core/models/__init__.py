"""What a model is: `ModelConfig` (configs), the named presets (presets), the blocks each model is
a stack of (layers/), the `Transformer` that stacks them (model), muP's width roles (mup), and how one is built on the meta
device and materialised shard by shard (init: the API; materialise: the per-unit mechanics).

May import: `hymo_core.kernels`, `hymo_core.planner` (parameter counts).
"""
