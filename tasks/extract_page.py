"""What an extraction child runs on one page: trafilatura, then encoding repair.

Kept apart from tasks/extract.py on purpose: a child imports only this module
(trafilatura and ftfy, lazily), not the stage plumbing and Prefect, so a fresh
child is ready in well under a second.
"""
from __future__ import annotations


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


def extract_page(job: tuple[str, str, str, bool, bool, bool]) -> tuple[str | None, str | None]:
    """Main text and, when asked, its encoding-repaired form: both in the child, so repair runs in parallel too."""
    text = extract_main_text(job[:5])
    return text, (repair_mojibake(text) if job[5] and text else None)


def repair_mojibake(text: str) -> str:
    """Only encoding repair: quotes, widths, ligatures and line breaks stay as the author wrote them."""
    import ftfy

    config = ftfy.TextFixerConfig(
        unescape_html=False, remove_terminal_escapes=False, fix_encoding=True, restore_byte_a0=True,
        replace_lossy_sequences=True, decode_inconsistent_utf8=True, fix_c1_controls=True,
        fix_latin_ligatures=False, fix_character_width=False, uncurl_quotes=False,
        fix_line_breaks=False, fix_surrogates=True, remove_control_chars=False, normalization=None,
    )
    return ftfy.fix_text(text, config=config)
