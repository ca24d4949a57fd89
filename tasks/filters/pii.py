"""Personal data: mask e-mail addresses, phone numbers and IP addresses; drop pages from blocked domains.

Seed 001, "个人数据和安全": regular expressions find e-mails, phones and IPs and
replace them with placeholder tokens (<EMAIL>, <PHONE>, <IP_ADDRESS>) rather
than deleting them, so the text stays readable. Over-matching hurts technical
text: a version number such as 10.2.0.1 looks like an IP address, so dotted
quads that read as versions (after "version"/"v", inside "pkg-1.2.3.4",
"==1.2.3.4", longer dotted runs) are left alone. Every masking is a
modification row per kind with its count and the masked spans (`edits`, offsets into the stage's input); a blocked domain or URL is a removal
(value 1 = blocklist matches, threshold 0, like C4's page rules).
"""
from __future__ import annotations

import bisect
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pyarrow as pa

from manifests.audit_edits import edits_detail
from manifests.schema import docs_table
from manifests.stage_manifest import StageManifest
from tasks.runner.stage_runner import ShardOutcome, StageDef, run_stage

STAGE = "pii"
VERSION = "1"


@dataclass(frozen=True)
class PiiConfig:
    mask_email: bool = True
    mask_phone: bool = True
    mask_ip: bool = True
    email_token: str = "<EMAIL>"
    phone_token: str = "<PHONE>"
    ip_token: str = "<IP_ADDRESS>"
    phone_min_digits: int = 7  # shorter digit runs are counts, years, ids
    phone_max_digits: int = 15  # E.164 maximum
    # Words right before a dotted quad that make it a version, not an address (seed 001: 10.2.0.1).
    version_cues: tuple[str, ...] = ("version", "versions", "ver", "v", "release", "released", "releases", "rev", "revision", "build",
                                     "firmware", "kernel", "update", "upgrade", "patch", "python", "tag", "since", "changelog")
    version_cue_window: int = 3  # how many words before the number are searched for a cue
    blocked_domains: tuple[str, ...] = ()  # a page whose URL host is one of these (or a subdomain) is removed
    blocked_url_prefixes: tuple[str, ...] = ()  # a page whose URL starts with one of these is removed


EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}(?![\w-])")
# A dotted quad not glued to other dotted numbers or ASCII identifier characters (1.2.3.4.5, v1.2.3.4);
# Han characters may touch it (IP地址192.168.1.1).
DOTTED_QUAD = re.compile(r"(?<![A-Za-z0-9_.\-=/])(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?![A-Za-z0-9_\-]|\.\d)")
PHONE = re.compile(
    r"(?<![A-Za-z0-9_+.\-/])"
    r"(?:"
    r"\+\d{1,3}(?:[ .\-]?\(?\d{1,4}\)?){2,5}"  # international: +44 20 7946 0958, +1-555-123-4567, +86 138 0013 8000
    r"|\(\d{3}\)\s?\d{3}[ .\-]\d{4}"  # (555) 123-4567
    r"|\d{3}[ .\-]\d{3}[ .\-]\d{4}"  # 555-123-4567, 555.123.4567
    r"|0\d{1,4}[ \-]\d{3,4}[ \-]\d{3,4}"  # national trunk prefix: 020 7946 0958, 010-6552-9988
    r"|1[3-9]\d{9}"  # mainland China mobile: 13800138000
    r")"
    r"(?![.\-]\d|[A-Za-z0-9_])"
)
DATE_LIKE = re.compile(r"^\d{4}[.\-]\d{2}[.\-]\d{2}$")
# What every match of DOTTED_QUAD contains: a text without it has no dotted quad, and skips the full regex
# (its look-behind runs at every position).
DIGIT_DOT_DIGIT = re.compile(r"\d\.\d")


def looks_like_version(text: str, start: int, config: PiiConfig) -> bool:
    """A dotted quad is a version when one of the few words before it is a version cue."""
    before = text[max(0, start - 60): start]
    words = re.findall(r"[A-Za-z]+", before)[-config.version_cue_window:]
    return any(word.lower() in config.version_cues for word in words)


def is_ip_address(match: re.Match[str], text: str, config: PiiConfig) -> bool:
    octets = [int(g) for g in match.groups()]
    if any(o > 255 for o in octets) or any(len(g) > 1 and g.startswith("0") for g in match.groups()):
        return False
    return not looks_like_version(text, match.start(), config)


def mask_ips(text: str, config: PiiConfig, found: list[tuple[int, int]] | None = None) -> tuple[str, int]:
    """`text` with its IP addresses masked, and how many; `found` gets each masked span (offsets into `text`)."""
    count = 0
    if not DIGIT_DOT_DIGIT.search(text):
        return text, 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        if is_ip_address(match, text, config):
            count += 1
            if found is not None:
                found.append(match.span())
            return config.ip_token
        return match.group(0)

    return DOTTED_QUAD.sub(replace, text), count


def is_phone_number(candidate: str, config: PiiConfig) -> bool:
    digits = sum(ch.isdigit() for ch in candidate)
    return config.phone_min_digits <= digits <= config.phone_max_digits and not DATE_LIKE.match(candidate)


def mask_phones(text: str, config: PiiConfig, found: list[tuple[int, int]] | None = None) -> tuple[str, int]:
    """`text` with its phone numbers masked, and how many; `found` gets each masked span (offsets into `text`)."""
    count = 0

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        if is_phone_number(match.group(0), config):
            count += 1
            if found is not None:
                found.append(match.span())
            return config.phone_token
        return match.group(0)

    return PHONE.sub(replace, text), count


def mask_emails(text: str, config: PiiConfig, found: list[tuple[int, int]] | None = None) -> tuple[str, int]:
    """`text` with its e-mail addresses masked, and how many; `found` gets each masked span (offsets into `text`)."""
    if "@" not in text:  # in every match
        return text, 0
    if found is None:
        return EMAIL.subn(config.email_token, text)

    def replace(match: re.Match[str]) -> str:
        found.append(match.span())
        return config.email_token

    masked = EMAIL.sub(replace, text)
    return masked, len(found)


def to_input_offsets(spans: list[tuple[int, int]], replaced: list[tuple[int, int]], token: str) -> list[tuple[int, int]]:
    """Offsets into a pass's output (`spans`, none inside a token) back to its input, given the spans that pass
    replaced with `token` (input offsets, in order)."""
    if not replaced:
        return spans
    ends_out, ends_in = [], []  # where each token ends in the output, and where its span ended in the input
    shift = 0
    for start, end in replaced:
        ends_out.append(start + shift + len(token))
        ends_in.append(end)
        shift += len(token) - (end - start)

    def back(position: int) -> int:
        before = bisect.bisect_right(ends_out, position)
        return position if before == 0 else ends_in[before - 1] + position - ends_out[before - 1]

    return [(back(start), back(end)) for start, end in spans]


def mask_pii(text: str, config: PiiConfig, spans: dict[str, list[tuple[int, int]]] | None = None) -> tuple[str, dict[str, int]]:
    """Masked text and the count per kind. E-mails first (their domains hold digits), then IPs, then phones.
    `spans` gets, per kind, the masked spans as offsets into the text given (each pass reads the one before's output)."""
    counts: dict[str, int] = {}
    passes: list[tuple[str, list[tuple[int, int]], str]] = []  # (kind, spans in that pass's input, token)
    for kind, enabled, mask, token in (("email", config.mask_email, mask_emails, config.email_token),
                                       ("ip_address", config.mask_ip, mask_ips, config.ip_token),
                                       ("phone", config.mask_phone, mask_phones, config.phone_token)):
        if not enabled:
            continue
        found: list[tuple[int, int]] | None = [] if spans is not None else None
        text, counts[kind] = mask(text, config, found)
        if found:
            passes.append((kind, found, token))
    if spans is not None:
        for i, (kind, found, _) in enumerate(passes):
            for _, earlier, token in reversed(passes[:i]):
                found = to_input_offsets(found, earlier, token)
            spans[kind] = found
    return text, {kind: n for kind, n in counts.items() if n}


def blocked_domain(url: str, blocked: tuple[str, ...]) -> str | None:
    """The blocklist entry that the URL's host equals or is a subdomain of, if any."""
    if not blocked or not url:
        return None
    host = (urlsplit(url).hostname or "").lower().rstrip(".")
    for domain in blocked:
        domain = domain.lower().strip(".")
        if host == domain or host.endswith("." + domain):
            return domain
    return None


def pii_shard(docs: pa.Table, config: PiiConfig, context: Any = None) -> ShardOutcome:
    kept: list[dict[str, Any]] = []
    audit: list[dict[str, Any]] = []
    for row in docs.to_pylist():
        domain = blocked_domain(row["url"], config.blocked_domains)
        if domain is not None:
            audit.append({"id": row["id"], "action": "removed", "rule": "pii_blocked_domain", "value": 1, "threshold": 0, "detail": {"url": row["url"], "domain": domain}})
            continue
        prefix = next((p for p in config.blocked_url_prefixes if row["url"].startswith(p)), None)
        if prefix is not None:
            audit.append({"id": row["id"], "action": "removed", "rule": "pii_blocked_url", "value": 1, "threshold": 0, "detail": {"url": row["url"], "prefix": prefix}})
            continue
        spans: dict[str, list[tuple[int, int]]] = {}
        masked, counts = mask_pii(row["text"], config, spans)
        for kind, n in counts.items():
            edits = edits_detail((start, end, kind) for start, end in spans[kind])
            audit.append({"id": row["id"], "action": "modified", "rule": f"pii_{kind}_masked", "value": n, "detail": {"kind": kind, "count": n, **edits}})
        row["text"] = masked
        kept.append(row)
    return ShardOutcome(docs_table(kept), audit)


PII = StageDef(STAGE, VERSION, pii_shard)


def run_pii(config: PiiConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(PII, config, input_dir, out_dir, workers)
