"""Turning raw bytes into text at ingestion, with every guess written down.

UTF-8 first; otherwise the most likely legacy encoding (charset_normalizer),
recorded as a modification so the audit shows which documents were guessed.
Binary and empty payloads are recognised here so no later stage sees them.
"""
from __future__ import annotations

from dataclasses import dataclass

# Control bytes other than \t \n \r \f: more than this share of a sample means binary.
BINARY_CONTROL_SHARE = 0.10
SNIFF_BYTES = 8192
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 12, 13))


@dataclass(frozen=True)
class Decoded:
    text: str | None
    encoding: str | None
    problem: str | None  # None | "empty" | "binary"
    guessed: bool = False


def decode_payload(payload: bytes) -> Decoded:
    if not payload.strip():
        return Decoded(None, None, "empty")
    head = payload[:SNIFF_BYTES]
    if b"\x00" in head and not (head.startswith((b"\xff\xfe", b"\xfe\xff"))):
        return Decoded(None, None, "binary")
    controls = sum(head.count(bytes([c])) for c in _CONTROL)
    if controls / len(head) > BINARY_CONTROL_SHARE:
        return Decoded(None, None, "binary")
    try:
        return Decoded(payload.decode("utf-8-sig"), "utf-8", None)
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(payload).best()
    if best is None:
        return Decoded(payload.decode("cp1252", errors="replace"), "cp1252", None, guessed=True)
    return Decoded(str(best), best.encoding, None, guessed=True)
