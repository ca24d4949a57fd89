"""Deciding between proxy runs: the decision rule an ablation fixes before it trains (rule), the paired
comparison of each variant with the base over the same held-out documents and suite items, across seeds
(compare), and its table and figure (report).

May import: `hymo_core.eval` (per-item records it pairs); nothing that trains.
"""
