"""Turning raw bytes into text at ingestion, with every guess written down.

The order is chosen so that the common mistakes of real crawls cost the least:

1. a byte-order mark decides;
2. UTF-8 when every byte decodes, and still UTF-8 (with U+FFFD for the bad
   bytes) when at least 99 % of the bytes decode and the valid multi-byte
   characters outnumber the bad bytes: a page with two stray bytes stays UTF-8
   instead of becoming ISO-8859-13;
3. the declared charset (HTTP header or `<meta charset>`) when it decodes;
4. cp1252 (Latin-1's superset) when the detector ranks it about as plausible as
   its best guess: a Latin-1 page mis-declared UTF-8 becomes "café", not cp775;
5. the detector's best guess (charset_normalizer) for the rest (Cyrillic, CJK).

Every choice but plain UTF-8 is returned with its method and confidence so the
caller audits it. Binary payloads (known magic bytes, or a high share of
control bytes) are recognised here; a text page with a few NUL or terminal
control characters is not binary: `strip_controls` cleans it instead.
"""
from __future__ import annotations

import codecs
import re
from dataclasses import dataclass

# Control bytes other than \t \n \f \r (NUL included): more than this share of a sample means binary.
BINARY_CONTROL_SHARE = 0.10
SNIFF_BYTES = 8192
UTF8_MIN_DECODED_SHARE = 0.99  # UTF-8 with replacement when at least this share of the bytes decodes
LATIN_MARGIN = 0.02  # cp1252 wins when its measured mess is within this of the detector's best guess
_CONTROL = bytes(b for b in range(32) if b not in (9, 10, 12, 13))
LATIN_NAMES = {"cp1252", "latin_1", "iso8859_15", "iso8859_1"}
MAGIC = {  # formats crawls serve under .html names: images, archives, documents, executables
    b"%PDF-": "pdf", b"\x89PNG\r\n\x1a\n": "png", b"GIF87a": "gif", b"GIF89a": "gif", b"\xff\xd8\xff": "jpeg",
    b"PK\x03\x04": "zip", b"\x1f\x8b": "gzip", b"BZh": "bzip2", b"\xfd7zXZ\x00": "xz", b"7z\xbc\xaf\x27\x1c": "7z",
    b"\x7fELF": "elf", b"MZ": "exe", b"RIFF": "riff", b"OggS": "ogg", b"ID3": "mp3", b"\x00\x00\x01\x00": "ico",
    b"wOFF": "woff", b"wOF2": "woff2", b"\xd0\xcf\x11\xe0": "ole2",
}
BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"),
        (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))
META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([a-zA-Z0-9_.:-]+)""", re.I)
# Terminal escape sequences (CSI/OSC) go whole; other C0 controls and DEL one by one. C1 controls stay:
# they are what ftfy reads to repair mojibake at extraction.
NON_ASCII_RUN = re.compile(r"[^\x00-\x7f]+")
PRINTABLE_ASCII = "".join(map(chr, range(32, 127))) + "\t\n\r"
CONTROL_TEXT = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|[\x00-\x08\x0b\x0e-\x1f\x7f]")
CONTROL_CHAR = re.compile(r"[\x00-\x08\x0b\x0e-\x1f\x7f]")  # the characters CONTROL_TEXT's every match starts with
SURROGATE = re.compile("[\udc80-\udcff]")
NON_ASCII = re.compile("[^\x00-\x7f]")


@dataclass(frozen=True)
class Decoded:
    text: str | None
    encoding: str | None
    problem: str | None  # None | "empty" | "binary"
    method: str = "utf-8"  # utf-8 | bom | utf-8-replace | declared | latin | detected | fallback
    confidence: float = 1.0  # share of bytes that decoded, or 1 - the detector's measured mess
    detail: str = ""  # for binary: the magic format or the control share

    @property
    def guessed(self) -> bool:
        return self.method not in ("utf-8", "bom")


def binary_reason(payload: bytes) -> str | None:
    """Why `payload` is not text (a known file signature, or mostly control bytes), or None."""
    for magic, name in MAGIC.items():
        if payload.startswith(magic) and not (name == "exe" and b"<" in payload[:64]):
            return f"magic:{name}"
    head = payload[:SNIFF_BYTES]
    if head.startswith((codecs.BOM_UTF16_LE, codecs.BOM_UTF16_BE)):
        return None
    share = sum(head.count(bytes([c])) for c in _CONTROL) / len(head)
    return f"control_share:{share:.3f}" if share > BINARY_CONTROL_SHARE else None


def declared_charset(payload: bytes, header: str | None = None) -> str | None:
    """The charset named by the HTTP header, else by a `<meta>` tag in the first bytes; a Python codec name."""
    names = []
    if header:
        found = re.search(r"charset\s*=\s*[\"']?([a-zA-Z0-9_.:-]+)", header, re.I)
        names.append(found.group(1) if found else header if "/" not in header else None)
    found = META_CHARSET.search(payload[:4096])
    names.append(found.group(1).decode("ascii", "ignore") if found else None)
    for name in names:
        if not name:
            continue
        try:
            return codecs.lookup(name).name
        except LookupError:
            continue
    return None


def utf8_share(payload: bytes) -> tuple[str, float, int, int]:
    """UTF-8 with U+FFFD for bad bytes; the share of bytes that decoded, the bad bytes, the valid non-ASCII characters."""
    escaped = payload.decode("utf-8", errors="surrogateescape")  # each bad byte becomes one lone surrogate
    bad = len(SURROGATE.findall(escaped))
    valid_non_ascii = len(NON_ASCII.findall(escaped)) - bad
    return SURROGATE.sub("\ufffd", escaped), 1.0 - bad / len(payload), bad, valid_non_ascii


def decode_payload(payload: bytes, header_charset: str | None = None) -> Decoded:
    """Bytes -> text by the order in the module docstring; `header_charset` is the HTTP Content-Type if any."""
    if not payload.strip():
        return Decoded(None, None, "empty")
    reason = binary_reason(payload)
    if reason:
        return Decoded(None, None, "binary", method="", confidence=0.0, detail=reason)
    for bom, codec in BOMS:
        if payload.startswith(bom):
            try:
                return Decoded(payload.decode(codec), codec.removesuffix("-sig"), None, method="bom")
            except UnicodeDecodeError:
                break
    try:
        return Decoded(payload.decode("utf-8"), "utf-8", None)
    except UnicodeDecodeError:
        pass
    text, share, bad, valid_non_ascii = utf8_share(payload)
    if share >= UTF8_MIN_DECODED_SHARE and valid_non_ascii >= bad:
        return Decoded(text, "utf-8", None, method="utf-8-replace", confidence=round(share, 4))
    declared = declared_charset(payload, header_charset)
    if declared and declared != "utf-8":
        try:
            return Decoded(payload.decode(declared), declared, None, method="declared")
        except UnicodeDecodeError:
            pass
    return detect(payload)


def detect(payload: bytes) -> Decoded:
    """cp1252 when the detector finds it about as plausible as its best guess, else the best guess."""
    from charset_normalizer import from_bytes

    matches = list(from_bytes(payload))
    if not matches:
        return Decoded(payload.decode("cp1252", errors="replace"), "cp1252", None, method="fallback", confidence=0.0)
    best = matches[0]
    for match in matches:
        if match.chaos <= best.chaos + LATIN_MARGIN and LATIN_NAMES & set(match.could_be_from_charset):
            return latin(payload, 1.0 - match.chaos)
    return Decoded(str(best), best.encoding, None, method="detected", confidence=round(1.0 - best.chaos, 4))


def latin(payload: bytes, confidence: float) -> Decoded:
    """cp1252; bytes it leaves undefined (0x81, 0x8d, 0x8f, 0x90, 0x9d) read as Latin-1."""
    try:
        return Decoded(payload.decode("cp1252"), "cp1252", None, method="latin", confidence=round(confidence, 4))
    except UnicodeDecodeError:
        return Decoded(payload.decode("latin-1"), "latin-1", None, method="latin", confidence=round(confidence, 4))


def guessed_spans(text: str, encoding: str) -> list[tuple[int, int, str]]:
    """The characters a guessed codec decided, labelled with it: the non-ASCII runs when the codec reads ASCII as
    ASCII (every byte below 0x80 then decodes the same whatever the guess), else the whole text."""
    try:
        ascii_compatible = PRINTABLE_ASCII.encode(encoding) == PRINTABLE_ASCII.encode("ascii")
    except (LookupError, UnicodeError):
        ascii_compatible = False
    if not ascii_compatible:
        return [(0, len(text), encoding)] if text else []
    return [(m.start(), m.end(), encoding) for m in NON_ASCII_RUN.finditer(text)]


def strip_controls(text: str) -> tuple[str, int]:
    """`text` without NUL, other C0 controls, DEL and terminal escape sequences (tab, newlines, form feed stay);
    and how many characters went."""
    if not CONTROL_CHAR.search(text):  # every match starts with one (ESC is a C0 control): a scan 3x cheaper than sub
        return text, 0
    cleaned = CONTROL_TEXT.sub("", text)
    return cleaned, len(text) - len(cleaned)
