"""PII masking: what is masked, what merely looks like PII and is spared, and the audit counts."""
from __future__ import annotations

import json

import pytest

from manifests.schema import docs_table
from tasks.filters.pii import PiiConfig, blocked_domain, mask_pii, run_pii
from tasks.runner.stage_runner import StageWriter, read_stage_audit, read_stage_docs

CONFIG = PiiConfig()


@pytest.mark.parametrize("text,masked,counts", [
    ("Write to jane.doe+news@mail.example.co.uk today.", "Write to <EMAIL> today.", {"email": 1}),
    ("Call +1-555-123-4567 or (555) 123-4567.", "Call <PHONE> or <PHONE>.", {"phone": 2}),
    ("Office: +44 20 7946 0958, fax 020 7946 0959", "Office: <PHONE>, fax <PHONE>", {"phone": 2}),
    ("手机13800138000，请联系。", "手机<PHONE>，请联系。", {"phone": 1}),
    ("The server at 192.168.1.10 refused; try 8.8.8.8.", "The server at <IP_ADDRESS> refused; try <IP_ADDRESS>.", {"ip_address": 2}),
    ("ssh admin@10.2.0.1", "ssh admin@<IP_ADDRESS>", {"ip_address": 1}),  # user@host: not an e-mail (no TLD); the host is masked
    ("IP地址192.168.0.1。", "IP地址<IP_ADDRESS>。", {"ip_address": 1}),
])
def test_masks_real_personal_data(text, masked, counts):
    assert mask_pii(text, CONFIG) == (masked, counts)


@pytest.mark.parametrize("text", [
    "Upgrade to version 10.2.0.1 before Friday.",  # seed 001: a version number that looks like an IP
    "Released 10.2.0.1 with fixes.",
    "pip install somepkg==1.2.3.4",
    "Download somepkg-1.2.3.4.tar.gz",
    "Python v3.11.2.1 and v10.2.0.1",
    "The OID 1.3.6.1.4.1 names an arc.",  # longer dotted run
    "Octets 300.1.2.3 are out of range.",
    "Dates 2024-01-15 and 2024.01.15 stay.",
    "ISBN 978-3-16-148410-0 and port 8080.",
    "It cost 1,234,567 dollars in 1999.",
    "Timestamp 12:30:45.123 recorded.",
    "See section 4.2.1.3 of the spec.",
])
def test_spares_technical_strings_that_look_like_pii(text):
    if "section" in text:
        # no cue word: a bare dotted quad in range is treated as an address (privacy first); documented
        assert mask_pii(text, CONFIG)[1] == {"ip_address": 1}
        assert mask_pii(text, PiiConfig(version_cues=CONFIG.version_cues + ("section",)))[1] == {}
    else:
        assert mask_pii(text, CONFIG) == (text, {})


def test_kinds_can_be_switched_off():
    text = "a@b.io 192.168.1.1 555-123-4567"
    assert mask_pii(text, PiiConfig(mask_email=False, mask_ip=False)) == ("a@b.io 192.168.1.1 <PHONE>", {"phone": 1})


def test_blocklist_matches_host_and_subdomains_only():
    blocked = ("spam.example",)
    assert blocked_domain("https://spam.example/x", blocked) == "spam.example"
    assert blocked_domain("http://www.SPAM.example:8080/a", blocked) == "spam.example"
    assert blocked_domain("https://notspam.example/", blocked) is None
    assert blocked_domain("", blocked) is None


def test_stage_logs_counts_per_kind(tmp_path):
    rows = [
        {"id": "a", "text": "Mail a@b.io and c@d.io, server 10.0.0.7.", "source": "s", "url": "https://ok.org/a", "lang": "en", "lang_score": 0.9, "meta": {}},
        {"id": "b", "text": "Nothing here, version 10.2.0.1.", "source": "s", "url": "https://ok.org/b", "lang": "en", "lang_score": 0.9, "meta": {}},
        {"id": "c", "text": "Buy now", "source": "s", "url": "https://spam.example/c", "lang": "en", "lang_score": 0.9, "meta": {}},
        {"id": "d", "text": "Old page", "source": "s", "url": "https://ok.org/archive/d", "lang": "en", "lang_score": 0.9, "meta": {}},
    ]
    upstream = tmp_path / "04_quality"
    writer = StageWriter("quality", "test", {}, "key", [], upstream)
    writer.write_shard(0, docs_table(rows), [])
    writer.publish()
    config = PiiConfig(blocked_domains=("spam.example",), blocked_url_prefixes=("https://ok.org/archive/",))
    manifest = run_pii(config, upstream, tmp_path / "05_pii", workers=1)
    assert manifest.counts["removed"] == {"pii_blocked_domain": 1, "pii_blocked_url": 1}
    assert manifest.counts["modified"] == {"pii_email_masked": 1, "pii_ip_address_masked": 1}
    audit = {(r["id"], r["rule"]): r for r in read_stage_audit(tmp_path / "05_pii").to_pylist()}
    assert audit[("a", "pii_email_masked")]["value"] == 2
    texts = {r["id"]: r["text"] for r in read_stage_docs(tmp_path / "05_pii").to_pylist()}
    assert texts == {"a": "Mail <EMAIL> and <EMAIL>, server <IP_ADDRESS>.", "b": "Nothing here, version 10.2.0.1."}


@pytest.mark.parametrize("text", ["x" * 5_000_000, "\x00\x01 mail\x00me@ex.com\x1b[0m " * 1000, "", "😀" * 1000, "电话：+86 138 0013 8000；邮箱 wang@例子.cn"])
def test_bad_input_is_masked_or_left_without_crash(text):
    masked, counts = mask_pii(text, CONFIG)
    assert set(counts) <= {"email", "phone", "ip_address"} and len(masked) <= len(text) + 20 * sum(counts.values())


def test_empty_upstream_shard_passes_through(tmp_path):
    """quality may remove every document of a shard; the next stage gets an empty shard and must accept it."""
    upstream = tmp_path / "04_quality"
    writer = StageWriter("quality", "test", {}, "key", [], upstream)
    writer.write_shard(0, docs_table([]), [])
    writer.publish()
    manifest = run_pii(CONFIG, upstream, tmp_path / "05_pii", workers=1)
    assert manifest.counts["in"] == 0 and manifest.counts["kept"] == 0
    assert read_stage_docs(tmp_path / "05_pii").num_rows == 0


def test_stage_records_each_masked_span_as_offsets_into_its_input(tmp_path):
    """Issue 56: a masking row carries its evidence, the spans of the text that entered the stage; the IP and phone
    passes read the e-mail pass's output, so their spans are mapped back through the shorter tokens before them."""
    text = "Mail ann.lee@example.com or bo@x.io, server 192.168.1.1, call 555-123-4567 or mail c@d.org at 10.0.0.2."
    rows = [{"id": "a", "text": text, "source": "s", "url": "https://ok.org/a", "lang": "en", "lang_score": 0.9, "meta": {}}]
    upstream = tmp_path / "04_quality"
    writer = StageWriter("quality", "test", {}, "key", [], upstream)
    writer.write_shard(0, docs_table(rows), [])
    writer.publish()
    run_pii(PiiConfig(), upstream, tmp_path / "05_pii", workers=1)
    audit = {r["rule"]: json.loads(r["detail"]) for r in read_stage_audit(tmp_path / "05_pii").to_pylist()}
    spans = {rule: [(text[start:end], label) for start, end, label in detail["edits"]] for rule, detail in audit.items()}
    assert spans == {"pii_email_masked": [("ann.lee@example.com", "email"), ("bo@x.io", "email"), ("c@d.org", "email")],
                     "pii_ip_address_masked": [("192.168.1.1", "ip_address"), ("10.0.0.2", "ip_address")],
                     "pii_phone_masked": [("555-123-4567", "phone")]}
    assert all("edits_total" not in detail for detail in audit.values())


def test_a_row_keeps_at_most_the_cap_of_spans_and_says_how_many_there_were():
    from manifests.audit_edits import EDITS_CAP, edits_detail

    text = " ".join(f"u{i}@ex.com" for i in range(EDITS_CAP + 36))
    spans: dict[str, list[tuple[int, int]]] = {}
    mask_pii(text, PiiConfig(), spans)
    detail = edits_detail((start, end, "email") for start, end in spans["email"])
    assert len(detail["edits"]) == EDITS_CAP and detail["edits_total"] == EDITS_CAP + 36
    assert text[detail["edits"][-1][0]:detail["edits"][-1][1]] == f"u{EDITS_CAP - 1}@ex.com"
