"""Context extension (`hymo extend CKPT --seq-len N`): the position plan (position), the data plan
(long_documents: only documents long enough for the new window), needle retrieval across the window
(needle), and the run that continues a checkpoint and re-tests it (extend).

May import: `hymo_core.models`, `hymo_core.train`, `hymo_core.checkpoint`, `hymo_core.eval`.
"""
