"""The pipeline's stages, one package per capability:

    runner/   the stage plumbing every stage uses (shard mapping, atomic writes, cache keys)
    ingest/   sources -> documents (ingest), HTML/WARC -> main text (extract)
    filters/  langid, heuristic quality rules, the quality classifier, PII, user filters
    dedup/    exact and MinHash-LSH dedup, decontamination, removal maps
    corpus/   split, tokenizer, mixture, shards (and retokenize for CPT)
    pretrain.py  the training stage, a thin wrapper over `hymo_core`

A stage named `S` lives in `tasks/<package>/S.py`, or `tasks/<package>/<rest>.py` when it is
named `<package>_<rest>` (`dedup_exact` -> `tasks/dedup/exact.py`); `tasks.runner.rule_digest`
finds it by that rule. Stage modules are pure functions over shards plus a `run_<stage>` entry;
the Prefect task that runs them is `flows.pipeline`'s.

May import: `manifests`, `hymo_core` (pretrain only). Never `flows`.
"""
