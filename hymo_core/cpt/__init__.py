"""Continued pretraining: the gate file written before training and its verdict (gate), replay of
the general corpus (replay), the run that trains and judges (run), and its
recipe, importable without torch (config).

May import: `hymo_core.train`, `hymo_core.checkpoint`, `hymo_core.eval`, `manifests`.
"""
