"""What an extraction child runs on one page: trafilatura, a fallback, then encoding repair.

When trafilatura returns nothing from a page that holds visible body text
(e.g. thousands of unclosed inline tags push the text past libxml2's depth
limit), the page falls back to trafilatura's `html2txt`, and when that too is
empty, to a streaming tag-stripper (the stdlib `html.parser`, which has no
depth limit). The path used is returned so the stage audits it.

Kept apart from tasks/ingest/extract.py on purpose: a child imports only this module
(trafilatura and ftfy, lazily), not the stage plumbing and Prefect, so a fresh
child is ready in well under a second.
"""
from __future__ import annotations

from tasks.ingest.mojibake import repair_mojibake


def extract_main_text(job: tuple[str, str, str, bool, bool]) -> str | None:
    """Trafilatura on one page (runs in the supervised child)."""
    import trafilatura

    html, url, favor, include_tables, include_comments = job
    return trafilatura.extract(
        html,
        url=url or None,
        include_tables=include_tables,
        include_comments=include_comments,
        favor_precision=favor == "precision",
        favor_recall=favor == "recall",
        deduplicate=False,
        with_metadata=False,
    )


def extract_page(job: tuple[str, str, str, bool, bool, bool, int]) -> tuple[str | None, str | None, str]:
    """Main text, when asked its encoding-repaired form (in the child, so repair runs in parallel too), and
    the extractor that produced it: trafilatura | html2txt | html_parser."""
    text, path = extract_with_fallback(job[:5], job[6])
    return text, (repair_mojibake(text) if job[5] and text else None), path


def extract_with_fallback(job: tuple[str, str, str, bool, bool], min_words: int) -> tuple[str | None, str]:
    """Trafilatura; if it finds nothing in a page with at least `min_words` visible words, a fallback."""
    text = extract_main_text(job)
    if (text and text.strip()) or min_words <= 0:
        return text, "trafilatura"
    visible = visible_text(job[0])
    words = len(visible.split())
    if words < min_words:
        return text, "trafilatura"
    import trafilatura

    flat = trafilatura.html2txt(job[0], clean=True)
    if len(flat.split()) * 2 >= words:
        return flat, "html2txt"
    return visible, "html_parser"


BLOCK_TAGS = {"p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "article", "section", "main",
              "blockquote", "pre", "table", "ul", "ol", "dd", "dt", "header", "footer", "td", "th"}
HIDDEN_TAGS = {"script", "style", "noscript", "template", "head", "title", "svg", "iframe", "object"}


def visible_text(html: str) -> str:
    """The body's text, one line per block element, by a streaming parser that no nesting depth stops."""
    from html.parser import HTMLParser

    class Collector(HTMLParser):
        def __init__(self) -> None:
            super().__init__(convert_charrefs=True)
            self.hidden, self.lines, self.line = 0, [], []

        def handle_starttag(self, tag: str, attrs) -> None:
            if tag in HIDDEN_TAGS:
                self.hidden += 1
            elif tag in BLOCK_TAGS:
                self.flush()

        def handle_endtag(self, tag: str) -> None:
            if tag in HIDDEN_TAGS:
                self.hidden = max(0, self.hidden - 1)
            elif tag in BLOCK_TAGS:
                self.flush()

        def handle_data(self, data: str) -> None:
            if not self.hidden:
                self.line.append(data)

        def flush(self) -> None:
            line = " ".join("".join(self.line).split())
            if line:
                self.lines.append(line)
            self.line = []

    collector = Collector()
    collector.feed(html)
    collector.close()
    collector.flush()
    return "\n".join(collector.lines)


