"""What a model is: `ModelConfig` (configs), the named presets (presets), the blocks each model is
a stack of (layers/), and the `Transformer` that stacks them (model).

May import: `hymo_core.kernels`, `hymo_core.planner` (parameter counts).
"""
