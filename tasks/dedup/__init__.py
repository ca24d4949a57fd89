"""Removing copies: exact dedup (`exact`), MinHash-LSH near-dup dedup (`fuzzy` and its helpers:
shingles, signatures, LSH buckets, pair Jaccard, spill files, union-find links), benchmark
decontamination (`decontam`), and the removal maps all three publish.

May import: `manifests`, `tasks.runner`.
"""
