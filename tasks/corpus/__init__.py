"""Turning kept documents into what the trainer reads: the held-out split by duplicate family
(`split`), the byte-level BPE tokenizer (`tokenizer`), per-source mixture weights and epochs
(`mixture`), packed token shards with the corpus manifest (`shards`), and re-tokenising a corpus
for continued pretraining (`retokenize`).

May import: `manifests`, `tasks.runner`, `tasks.dedup` (split reads removal maps).
"""
