"""Checkpoints: what every format shares (common: errors, compatibility checks, RNG payloads,
checkpoint names), the single-file format (single), the DCP directory format written by torchrun
ranks (sharded), one loader for both (load), and uniform / EMA averages of late checkpoints (average).

May import: `hymo_core.models`, `hymo_core.train` (configs, state, loaders), `hymo_core.distributed`.
"""
