"""Arithmetic before a run: parameter counts, FLOPs per token, memory per rank, checkpoint
intervals (planner), and the `hymo plan` command line over the presets (cli).

May import: `hymo_core.models` (it reads configs; configs never import it).
"""
