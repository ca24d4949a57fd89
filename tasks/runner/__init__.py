"""Stage plumbing shared by every stage: the runner that maps a stage's pure shard function over
shards (processes or Dask workers), writes data/audit Parquet and the manifest atomically, and the
cache key's ingredients (the rule-code digest, the code version).

May import: `manifests`. Never a stage package (`tasks.ingest`, `tasks.filters`, ...), never `flows`.
"""
