"""C4's page and line rules (the TFDS `c4_utils.clean_page` reference): lorem ipsum, curly brackets,
policy lines, short and unpunctuated lines, the sentence count."""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field


from tasks.filters.quality_config import rule_skipped
from tasks.filters.quality_config import QualityConfig, Verdict, verdict_below
from tasks.filters.text_view import CITATION, SENTENCE_END, TextView


@dataclass
class C4Cleaning:
    """Result of C4's line pass: the page verdict, surviving lines and why the others went."""

    page_rule: str | None  # c4_lorem_ipsum | c4_curly_bracket | None
    kept_lines: list[str]
    sentences: int
    removed_lines: dict[str, int]
    citations_removed: int
    # Evidence for the audit row: (line number in text.splitlines(), reason) of each removed line, and
    # (line number, start, end) of each citation cut from a kept line, offsets within that line.
    removed_at: list[tuple[int, str]] = field(default_factory=list)
    citation_spans: list[tuple[int, int, int]] = field(default_factory=list)


def c4_clean_lines(text: str, config: QualityConfig, check_braces: bool = True, check_lorem: bool = True,
                   lines: tuple[list[str], list[str]] | None = None, lower_text: str | None = None) -> C4Cleaning:
    """Line by line, in the TFDS order: long word, citations, end mark, word count, lorem/javascript/brace/policy.
    `lines`: the text's (splitlines, each stripped) and `lower_text` its lower case, when a view has them already."""
    removed: Counter[str] = Counter()
    removed_at: list[tuple[int, str]] = []
    citation_spans: list[tuple[int, int, int]] = []
    kept: list[str] = []
    citations = 0

    def drop(number: int, reason: str) -> None:
        removed[reason] += 1
        removed_at.append((number, reason))

    def stop(page_rule: str) -> C4Cleaning:
        return C4Cleaning(page_rule, kept, sentence_count(kept), dict(removed), citations, removed_at, citation_spans)

    # Page-level scans first: a line's lower-case (after its citation cut) is a piece of the page's with the same
    # cuts (marks never span lines; str.lower maps each character alone, and final sigma's context ends at the
    # line's stripped edges either way), so a phrase absent from the page is absent from every line, and most
    # pages skip the per-line lower() and phrase tests.
    if "[" in text:
        lower_page = CITATION.sub("", text).lower()
    else:
        lower_page = lower_text if lower_text is not None else text.lower()
    check_lorem = check_lorem and "lorem ipsum" in lower_page
    check_braces = check_braces and "{" in text
    has_javascript = "javascript" in lower_page
    policy = tuple(phrase for phrase in config.c4_policy_substrings if phrase in lower_page)
    needs_lower = check_lorem or has_javascript or bool(policy)
    longest_word, min_words = config.c4_max_word_length, config.c4_min_words_per_line
    end_marks, drop_unpunctuated = config.c4_end_marks, config.c4_drop_unpunctuated_lines
    raw_lines, stripped = lines if lines is not None else (text.splitlines(), None)
    for number, line in enumerate(stripped if stripped is not None else map(str.strip, raw_lines)):
        if not line:
            continue  # blank lines are layout, not content; TFDS drops them as 'no end mark'
        if len(line) > longest_word and max(map(len, line.split())) > longest_word:  # a shorter line has no longer word
            drop(number, "too_long_word")
            continue
        cut: list[tuple[int, int, int]] = []
        if "[" in line:  # every citation mark starts with one: the regex runs only where it can match
            raw = raw_lines[number]
            indent = len(raw) - len(raw.lstrip())
            cut = [(number, indent + m.start(), indent + m.end()) for m in CITATION.finditer(line)]
            if cut:
                line = CITATION.sub("", line)
                citations += len(cut)
        if drop_unpunctuated and (not line.endswith(end_marks) or line.endswith("...")):
            drop(number, "no_terminal_punct")
            continue
        if len(line.split(None, min_words - 1)) < min_words:  # words after the citation cut, counted up to min_words
            drop(number, "too_few_words")
            continue
        lower = line.lower() if needs_lower else ""
        if check_lorem and "lorem ipsum" in lower:
            return stop("c4_lorem_ipsum")
        if has_javascript and "javascript" in lower:
            drop(number, "javascript")
            continue
        if check_braces and "{" in line:
            return stop("c4_curly_bracket")
        if policy and any(phrase in lower for phrase in policy):
            drop(number, "policy")
            continue
        citation_spans += cut  # a citation on a removed line is part of that line's removal
        kept.append(line)
    return C4Cleaning(None, kept, sentence_count(kept), dict(removed), citations, removed_at, citation_spans)


# A line's first SENTENCE_END match and the rest of its line: one match for each line that holds a sentence end.
LINE_WITH_SENTENCE_END = re.compile(SENTENCE_END.pattern + r"[^\n]*")


def sentence_count(lines: list[str]) -> int:
    """C4's sentences: each line's SENTENCE_END matches, at least one a line. Two scans of the lines joined by
    newlines instead of a regex call per line: the matches, plus one for each line with none (a line holds no line
    break, and a newline satisfies the look-ahead as the line's end did, so no match changes)."""
    joined = "\n".join(lines)
    return len(SENTENCE_END.findall(joined)) + len(lines) - len(LINE_WITH_SENTENCE_END.findall(joined))


def _c4(view: TextView, config: QualityConfig) -> C4Cleaning:
    """C4's line pass, run once per document and config (the three C4 rules and the modification share it)."""
    key = ("_c4", id(config))
    if key not in view.__dict__:
        # A skipped page rule must not stop the line pass early, or the kept text would be cut short.
        view.__dict__[key] = c4_clean_lines(view.text, config, check_braces=not rule_skipped("c4_curly_bracket", config.skip_rules),
                                            check_lorem=not rule_skipped("c4_lorem_ipsum", config.skip_rules),
                                            lines=(view.raw_lines, view.stripped_lines), lower_text=view.lower)
    return view.__dict__[key]


def c4_lorem_ipsum(view: TextView, config: QualityConfig) -> Verdict:
    return Verdict(_c4(view, config).page_rule != "c4_lorem_ipsum", "c4_lorem_ipsum", float(_c4(view, config).page_rule == "c4_lorem_ipsum"), 0.0)


def c4_curly_bracket(view: TextView, config: QualityConfig) -> Verdict:
    return Verdict(_c4(view, config).page_rule != "c4_curly_bracket", "c4_curly_bracket", float(_c4(view, config).page_rule == "c4_curly_bracket"), 0.0)


def c4_too_few_sentences(view: TextView, config: QualityConfig) -> Verdict:
    cleaning = _c4(view, config)
    if cleaning.page_rule is not None:  # the page already failed; sentences were not all counted
        return Verdict(True, "c4_too_few_sentences", float(cleaning.sentences), float(config.c4_min_sentences))
    return verdict_below("c4_too_few_sentences", cleaning.sentences, config.c4_min_sentences)
