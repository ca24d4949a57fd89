"""Deciding which documents stay: language ID (fastText lid.176), the heuristic quality rules
(one module per rule family: Gopher quality, Gopher repetition, C4, FineWeb, CJK; the per-source
profiles in `profiles`), the model-based quality classifier and its training, PII masking, and
user-written filter plugins.

May import: `manifests`, `tasks.runner`, `tasks.ingest` (classifier training reads sources).
"""
