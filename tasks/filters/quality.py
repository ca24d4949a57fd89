"""Heuristic quality filters: Gopher quality + repetition, C4 lines, FineWeb, and Chinese-aware rules.

Seed 001, "启发式质量过滤器" (and "按成本排序，并保留日志"): cheap statistics after
whitespace tokenisation decide most junk; each rule targets one kind of junk.
Thresholds below are the published numbers (Gopher: Rae et al. 2021 Table A1;
C4: the TFDS `c4_utils.clean_page` reference; FineWeb: Penedo et al. 2024) and
live only in `QualityConfig`.

Every rule is a pure function `(TextView, QualityConfig) -> Verdict`: keep or
drop, the name of the failure (`gopher_too_few_stop_words`), the measured value
and the threshold. The rule set follows the document's language (space-less
scripts get character rules) and its source profile (web, the default, is
FineWeb's published chain; prose / documentation / code skip rules by name,
recorded in the audit detail). Definitions that
differ from datatrove's are listed in docs/quality.md.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from manifests.audit_edits import Edit, edits_detail, line_spans
from manifests.schema import dumps_json
from manifests.stage_manifest import StageManifest
from tasks.filters.quality_config import rule_skipped, verdict_below
from tasks.filters.c4 import C4Cleaning, _c4, c4_curly_bracket, c4_lorem_ipsum, c4_too_few_sentences
from tasks.filters.cjk import cjk_duplicate_char_ngram_rule, cjk_too_few_chars, cjk_too_many_chars, zh_too_few_function_words, zh_too_few_han_chars
from tasks.filters.fineweb import fineweb_duplicate_line_chars, fineweb_too_few_terminal_punct_lines, fineweb_too_many_newlines_per_word, fineweb_too_many_short_lines
from tasks.filters.gopher_quality import gopher_mean_word_length_too_long, gopher_mean_word_length_too_short, gopher_too_few_alphabetic_words, gopher_too_few_stop_words, gopher_too_few_words, gopher_too_many_bullet_lines, gopher_too_many_ellipses, gopher_too_many_ellipsis_lines, gopher_too_many_hash_symbols, gopher_too_many_words
from tasks.filters.gopher_repetition import gopher_duplicate_line_chars, gopher_duplicate_lines, gopher_duplicate_ngram_rule, gopher_duplicate_paragraph_chars, gopher_duplicate_paragraphs, gopher_top_ngram_rule
from tasks.filters.profiles import C4_LINE_FILTER
from tasks.filters.quality_config import QualityConfig, Verdict
from tasks.filters.text_view import LETTER, SCRIPT_SAMPLE_CHARS, SPACELESS_SCRIPT, TextView
from tasks.filters.word_ngrams import WordNgrams
from tasks.runner.rule_stats import measured_rows
from tasks.runner.stage_runner import ShardOutcome, StageDef, run_stage

STAGE = "quality"
VERSION = "2"  # 2: stats/ holds each rule's statistic on a sample of the documents that reached it


# ---------------------------------------------------------------- rules: any language
def quality_empty_text(view: TextView, config: QualityConfig) -> Verdict:
    return verdict_below("quality_empty_text", len(view.text.strip()), 1)


# ---------------------------------------------------------------- rule sets
Rule = Callable[[TextView, QualityConfig], Verdict]


def whitespace_rules(config: QualityConfig, lang: str | None) -> list[Rule]:
    """Gopher quality, Gopher repetition, C4, FineWeb — in that order (cheap before expensive within each)."""
    rules: list[Rule] = [
        gopher_too_few_words, gopher_too_many_words, gopher_mean_word_length_too_short, gopher_mean_word_length_too_long,
        gopher_too_many_hash_symbols, gopher_too_many_ellipses, gopher_too_many_bullet_lines, gopher_too_many_ellipsis_lines,
        gopher_too_few_alphabetic_words,
    ]
    if lang is None or lang in config.stop_word_langs:
        rules.append(gopher_too_few_stop_words)
    rules += [gopher_duplicate_lines, gopher_duplicate_paragraphs, gopher_duplicate_line_chars, gopher_duplicate_paragraph_chars]
    rules += [gopher_top_ngram_rule(n, t) for n, t in config.max_top_ngram_char_fraction]
    rules += [gopher_duplicate_ngram_rule(n, t) for n, t in config.max_duplicate_ngram_char_fraction]
    rules += [c4_lorem_ipsum, c4_curly_bracket, c4_too_few_sentences]
    rules += [fineweb_too_few_terminal_punct_lines, fineweb_too_many_short_lines, fineweb_duplicate_line_chars, fineweb_too_many_newlines_per_word]
    return rules


def spaceless_rules(config: QualityConfig, lang: str | None) -> list[Rule]:
    """Character rules for scripts without spaces; line/paragraph repetition is whitespace-free and stays."""
    rules: list[Rule] = [cjk_too_few_chars, cjk_too_many_chars]
    if lang is None or lang in config.han_langs:
        rules += [zh_too_few_han_chars, zh_too_few_function_words]
    rules += [gopher_duplicate_lines, gopher_duplicate_paragraphs, gopher_duplicate_line_chars, gopher_duplicate_paragraph_chars]
    rules += [cjk_duplicate_char_ngram_rule(n, t) for n, t in config.max_duplicate_char_ngram_fraction]
    return rules


def uses_spaceless_rules(view: TextView, lang: str | None, config: QualityConfig) -> bool:
    if lang is not None:
        return lang in config.spaceless_langs
    head = view.text[:SCRIPT_SAMPLE_CHARS]  # no language label: decide by the script of the opening
    letters = len(LETTER.findall(head))
    return letters > 0 and len(SPACELESS_SCRIPT.findall(head)) / letters > 0.5


@dataclass
class QualityDecision:
    keep: bool
    failures: list[Verdict]  # in rule order; the first is the one logged
    rule_set: str  # "whitespace" | "spaceless"
    skipped: list[str]
    c4: C4Cleaning | None
    flags: list[Verdict] = field(default_factory=list)  # report-only rules that failed; they removed nothing
    measured: list[Verdict] = field(default_factory=list)  # every rule this document reached, in order (rule_stats)


@dataclass(frozen=True)
class RulePlan:
    removing: list[Rule]  # in order; the first failure removes the document
    reporting: list[Rule]  # report-only: evaluated, recorded, never remove
    skipped: list[str]


C4_PAGE_RULES = ("c4_lorem_ipsum", "c4_curly_bracket")  # they end C4's line pass, so they cannot be report-only
_PLANS: dict[int, tuple[QualityConfig, dict[tuple[bool, str | None], RulePlan]]] = {}


def rule_plan(config: QualityConfig, lang: str | None, spaceless: bool) -> RulePlan:
    """The rules to run for this config and language, split into removing and report-only; built once, then reused."""
    cached = _PLANS.get(id(config))
    if cached is None or cached[0] is not config:
        if len(_PLANS) > 64:
            _PLANS.clear()
        cached = _PLANS[id(config)] = (config, {})
    key = (spaceless, lang)
    if key not in cached[1]:
        blocked = [name for name in C4_PAGE_RULES if rule_skipped(name, config.report_rules)]
        if blocked:
            raise ValueError(f"quality.report_rules: {blocked} end C4's line pass and cannot be report-only; put them in skip_rules")
        candidates = spaceless_rules(config, lang) if spaceless else whitespace_rules(config, lang)
        skipped = [rule.__name__ for rule in candidates if rule_skipped(rule.__name__, config.skip_rules)]
        applied = [rule for rule in candidates if rule.__name__ not in skipped]
        reporting = [rule for rule in applied if rule_skipped(rule.__name__, config.report_rules)]
        removing = [rule for rule in applied if rule not in reporting]
        if not spaceless and rule_skipped(C4_LINE_FILTER, config.skip_rules):
            skipped.append(C4_LINE_FILTER)
        cached[1][key] = RulePlan(removing, reporting, skipped)
    return cached[1][key]


def evaluate(text: str, lang: str | None, config: QualityConfig, view: TextView | None = None) -> QualityDecision:
    """Run the rule set for this language (first failure only, or all rules when config.all_rules); `view` is the
    text's view when its batch made one (its word n-grams then come from the batch)."""
    view = view if view is not None else TextView(text)
    empty = quality_empty_text(view, config)
    if not empty.keep:
        return QualityDecision(False, [empty], "none", [], None, measured=[empty])
    spaceless = uses_spaceless_rules(view, lang, config)
    plan = rule_plan(config, lang, spaceless)
    failures: list[Verdict] = []
    measured = [empty]
    for rule in plan.removing:
        verdict = rule(view, config)
        measured.append(verdict)
        if not verdict.keep:
            failures.append(verdict)
            if not config.all_rules:
                break
    reported = [rule(view, config) for rule in plan.reporting]
    measured += reported
    flags = [verdict for verdict in reported if not verdict.keep]
    c4 = None
    if not failures and not spaceless and C4_LINE_FILTER not in plan.skipped:
        c4 = _c4(view, config)
    return QualityDecision(not failures, failures, "spaceless" if spaceless else "whitespace", plan.skipped, c4, flags, measured)


def c4_edits(text: str, cleaning: C4Cleaning) -> list[Edit]:
    """C4's removals as offsets into `text`: each removed line with its reason, each citation cut from a kept line."""
    spans = line_spans(text)
    edits = [(spans[number][0], spans[number][1], reason) for number, reason in cleaning.removed_at]
    return edits + [(spans[number][0] + start, spans[number][0] + end, "citation") for number, start, end in cleaning.citation_spans]


def profile_configs(config: QualityConfig) -> dict[str, QualityConfig]:
    """The effective config of each profile: the base with that profile's overrides applied."""
    known = {f.name for f in fields(QualityConfig)} - {"profiles"}
    resolved = {}
    for profile, overrides in config.profiles.items():
        unknown = set(overrides) - known
        if unknown:
            raise ValueError(f"quality.profiles.{profile}: unknown fields {sorted(unknown)}; known: {sorted(known)}")
        values = {k: tuple(tuple(x) if isinstance(x, list) else x for x in v) if isinstance(v, list) else v for k, v in overrides.items()}
        for listed in ("skip_rules", "report_rules"):  # a profile adds to the base lists
            if listed in values:
                values[listed] = tuple(getattr(config, listed)) + tuple(values[listed])
        resolved[profile] = replace(config, **values)
    return resolved


def quality_shard(docs: pa.Table, config: QualityConfig, context: Any = None) -> ShardOutcome:
    """The columns it reads as lists, one decision per document; the kept rows leave as a filter of the shard with
    their text (C4's line removal) and meta (report-only failures) replaced, like langid's, not rebuilt row by row."""
    by_profile = profile_configs(config)
    keep_mask: list[bool] = []
    texts, metas = docs.column("text").to_pylist(), docs.column("meta").to_pylist()
    audit: list[dict[str, Any]] = []
    verdicts: list[Verdict] = []  # every rule each document reached, in document order (tasks.runner.rule_stats)
    reached_counts, profiles = [], []
    batch = WordNgrams(docs.column("text"))  # every document's words split once, each n's windows sorted once
    columns = zip(docs.column("id").to_pylist(), docs.column("source").to_pylist(), docs.column("lang").to_pylist(), texts, metas)
    for i, (doc_id, source, lang, text, meta_json) in enumerate(columns):
        meta = json.loads(meta_json)
        profile = meta.get("profile") or config.default_profile
        if profile not in by_profile:
            raise ValueError(f"quality: document {doc_id} ({source}) has profile {profile!r}; configured profiles: {sorted(by_profile)}")
        effective = by_profile[profile]
        view = TextView(text, batch, i)
        decision = evaluate(text, lang, effective, view)
        keep_mask.append(decision.keep)
        verdicts += decision.measured
        reached_counts.append(len(decision.measured))
        profiles.append(profile)
        detail: dict[str, Any] = {"profile": profile, "rule_set": decision.rule_set, "lang": lang}
        if decision.skipped:
            detail["skipped_rules"] = decision.skipped
        flags = [[v.rule, round(v.value, 6), v.threshold] for v in decision.flags]
        if flags:
            detail["report_only_failures"] = flags
        if not decision.keep:
            first = decision.failures[0]
            if config.all_rules:
                detail["all_failures"] = [[v.rule, round(v.value, 6), v.threshold] for v in decision.failures]
            audit.append({"id": doc_id, "action": "removed", "rule": first.rule, "value": first.value, "threshold": first.threshold, "detail": detail})
            continue
        cleaning = decision.c4
        if cleaning is not None and (cleaning.removed_lines or cleaning.citations_removed):
            new_text = "\n".join(cleaning.kept_lines)
            if new_text != text:
                lines_before = len(view.lines)
                audit.append({"id": doc_id, "action": "modified", "rule": "c4_lines_removed", "value": sum(cleaning.removed_lines.values()), "threshold": None,
                              "detail": {**detail, "removed_by_reason": cleaning.removed_lines, "citations_removed": cleaning.citations_removed,
                                         "lines_before": lines_before, "lines_after": len(cleaning.kept_lines), "chars_before": len(text), "chars_after": len(new_text),
                                         **edits_detail(c4_edits(text, cleaning))}})
                texts[i] = new_text
        if flags:
            metas[i] = dumps_json({**meta, "quality_flags": flags})
    mask = pa.array(keep_mask, pa.bool_())
    kept = docs.filter(mask)
    kept = kept.set_column(kept.schema.get_field_index("text"), kept.schema.field("text"), pa.array(texts, pa.string()).filter(mask))
    kept = kept.set_column(kept.schema.get_field_index("meta"), kept.schema.field("meta"), pa.array(metas, pa.string()).filter(mask))
    stats = measured_rows(docs.column("id").to_pylist(), docs.column("source").to_pylist(), profiles, reached_counts, verdicts)
    return ShardOutcome(kept, audit, stats)


QUALITY = StageDef(STAGE, VERSION, quality_shard)


def run_quality(config: QualityConfig, input_dir: Path, out_dir: Path, workers: int | None = None) -> StageManifest:
    return run_stage(QUALITY, config, input_dir, out_dir, workers)
