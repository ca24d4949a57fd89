"""Measuring a checkpoint: fixed-prefix validation and cloze (evaluation), log-likelihood scoring
(lm_scoring), the offline benchmark suite (suite), the code sandbox HumanEval runs in (sandbox), and
the report `hymo eval` prints (report), held-out loss per source and language (heldout), and several
checkpoints paired on the same windows and items (paired).

May import: `hymo_core.models`, `hymo_core.train`, `hymo_core.checkpoint`, `hymo_core.distributed` (evaluation over ranks),
`manifests` (benchmark files).
"""
