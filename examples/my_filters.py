"""An example user-defined filter stage (README, "Your own filter stages"; used by tests/tasks/filters/test_user_filter.py).

Enable it in a pipeline TOML:

    [[filters]]
    name = "no_lorem"
    after = "quality"
    function = "my_filters:no_lorem"

with this file next to the TOML (or anywhere on PYTHONPATH).
"""
from __future__ import annotations

import re

from tasks.filters.user_filter import Decision

LOREM = re.compile(r"\blorem\s+ipsum\b", re.IGNORECASE)
MAX_LOREM_PER_1000_WORDS = 1.0  # a single quoted "lorem ipsum" in a long article is fine; filler text is not


def no_lorem(text: str, meta: dict) -> Decision:
    """Drop placeholder text: "lorem ipsum" occurrences per 1,000 words above the limit."""
    words = max(1, len(text.split()))
    per_1000_words = 1000 * len(LOREM.findall(text)) / words
    return Decision(keep=per_1000_words <= MAX_LOREM_PER_1000_WORDS, rule="no_lorem_placeholder_text",
                    value=per_1000_words, threshold=MAX_LOREM_PER_1000_WORDS)
