"""Which tokenizer a checkpoint was trained with (its file's sha256), and the check every reader makes.

Two tokenizers with the same vocabulary size give token ids that mean different things: a model
scored, sampled or exported with the wrong one prints confident numbers or garbage. So every
checkpoint (single file and DCP metadata) records `tokenizer_sha256`, the corpus manifest's hash of
its tokenizer file, and eval, generate, the suite, export, cpt and trace refuse a corpus (or
tokenizer) whose hash differs, in one line naming both digests.

A checkpoint written before the field existed cannot be checked: it is used with a warning that
says so (only the vocabulary sizes are compared), never refused, since refusing would strand every
older run's checkpoints for a fact they simply do not hold.
"""
from __future__ import annotations

import sys
from pathlib import Path
from typing import Any, Callable

from hymo_core.checkpoint.common import CheckpointError

TOKENIZER_KEY = "tokenizer_sha256"


class TokenizerMismatch(CheckpointError):
    """The checkpoint was trained with another tokenizer than the corpus (or file) it is given."""


def corpus_tokenizer_sha256(reader: Any) -> str | None:
    """The sha256 the corpus manifest records for its tokenizer file (None for a corpus that names none)."""
    return ((getattr(reader, "manifest", None) or {}).get("tokenizer") or {}).get("sha256")


def warn_on_stderr(message: str) -> None:
    print(f"warning: {message}", file=sys.stderr)


def check_tokenizer(payload: dict[str, Any], checkpoint: str | Path, given_sha256: str | None, given: str | Path,
                    warn: Callable[[str], None] = warn_on_stderr) -> None:
    """Refuse `given` (a corpus or tokenizer file whose tokenizer hash is `given_sha256`) unless the checkpoint
    was trained with that tokenizer; a checkpoint or corpus that records no hash is used with a warning."""
    recorded = payload.get(TOKENIZER_KEY)
    if recorded is None:
        warn(f"{checkpoint}: written before checkpoints recorded their tokenizer's sha256, so the tokenizer of {given} "
             f"({str(given_sha256)[:12]}…) cannot be checked against it; only the vocabulary size is")
        return
    if given_sha256 is None:
        warn(f"{given}: records no tokenizer sha256, so it cannot be checked against {checkpoint}'s tokenizer {recorded[:12]}…")
        return
    if recorded != given_sha256:
        raise TokenizerMismatch(f"{checkpoint}: trained with tokenizer sha256 {recorded}, but {given} has tokenizer sha256 "
                                f"{given_sha256}; give the corpus (or tokenizer) the checkpoint was trained with")


def check_corpus_tokenizer(payload: dict[str, Any], checkpoint: str | Path, reader: Any,
                           warn: Callable[[str], None] = warn_on_stderr) -> None:
    """check_tokenizer against a CorpusReader's tokenizer."""
    check_tokenizer(payload, checkpoint, corpus_tokenizer_sha256(reader), reader.path, warn)
