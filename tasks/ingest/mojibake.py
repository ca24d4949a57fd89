"""Encoding repair (ftfy's), with ftfy's own "is there mojibake here?" test answered without its slow regex.

ftfy leaves a line alone unless its badness regex matches it (or it holds a C1 control or a surrogate, which
the two other fixes this config turns on act on). That regex is an alternation of ~37 branches tried at
every position: on documentation pages it costs ~60 us a line, and 3 lines in 77,000 are bad. Every branch
needs one character from a small non-ASCII set somewhere in its match (worked out from the compiled regex
itself, so a new ftfy changes the set with it), so:

* a line with none of those characters cannot be bad (one C-level character-class scan);
* otherwise a match must start at most MAX_BRANCH - 1 characters before one of them: the regex is tried
  at those positions only (`match` at a position is exactly what `search` tries there).

The answer is ftfy's, line for line (tests/tasks/ingest/test_extract.py checks it against `ftfy.fix_text`).
"""
from __future__ import annotations

import re
from functools import lru_cache

C1_CONTROLS = range(0x80, 0xA0)  # fix_c1_controls acts on these
SURROGATES = range(0xD800, 0xE000)  # fix_surrogates acts on these


@lru_cache(maxsize=1)
def mojibake_config():
    """Only encoding repair: quotes, widths, ligatures and line breaks stay as the author wrote them."""
    import ftfy

    return ftfy.TextFixerConfig(
        unescape_html=False, remove_terminal_escapes=False, fix_encoding=True, restore_byte_a0=True,
        replace_lossy_sequences=True, decode_inconsistent_utf8=True, fix_c1_controls=True,
        fix_latin_ligatures=False, fix_character_width=False, uncurl_quotes=False,
        fix_line_breaks=False, fix_surrogates=True, remove_control_chars=False, normalization=None,
    )


def _class_chars(item) -> set[int] | None:
    """The code points one regex item matches, when it is a literal or a plain character class."""
    import re._parser as parser

    op, arg = item
    if op is parser.LITERAL:
        return {arg}
    if op is not parser.IN:
        return None
    chars: set[int] = set()
    for kind, value in arg:
        if kind is parser.LITERAL:
            chars.add(value)
        elif kind is parser.RANGE:
            chars.update(range(value[0], value[1] + 1))
        else:  # a negated class or a category (\w, \s): matches ASCII too
            return None
    return chars


@lru_cache(maxsize=1)
def badness_triggers() -> tuple[re.Pattern, int, frozenset[int]]:
    """(a class matching a character every badness branch needs, the longest branch in characters, the class's code points).

    Per branch, the smallest all-non-ASCII character class among its items; a branch without one would
    make the fast test unsound, so it fails here rather than answering wrongly."""
    import re._parser as parser

    from ftfy.badness import BADNESS_RE

    tree = parser.parse(BADNESS_RE.pattern, BADNESS_RE.flags)
    if len(tree) != 1 or tree[0][0] is not parser.BRANCH:
        raise RuntimeError("ftfy's badness regex is no longer one alternation; the mojibake fast path cannot vouch for it")
    needed: set[int] = set(C1_CONTROLS) | set(SURROGATES)
    longest = 0
    for branch in tree[0][1][1]:
        classes = [c for c in map(_class_chars, branch) if c and min(c) >= 0x80]
        if not classes:
            raise RuntimeError(f"a badness branch needs no non-ASCII character: {branch}")
        needed |= min(classes, key=len)
        low, high = parser.SubPattern(parser.State(), list(branch)).getwidth()
        if high >= parser.MAXREPEAT:
            raise RuntimeError(f"a badness branch has no bounded width: {branch}")
        longest = max(longest, high)
    plain = "".join(re.escape(chr(c)) for c in sorted(needed) if c not in SURROGATES)
    return re.compile(f"[{plain}\ud800-\udfff]"), longest, frozenset(needed)


@lru_cache(maxsize=1)
def trigger_class_re2() -> str:
    """The trigger class as an RE2 pattern, for Arrow's vectorised regex: a text it does not match has no line
    ftfy could change. Surrogates are left out: an Arrow string is valid UTF-8 and cannot hold one."""
    return "[" + "".join(f"\\x{{{c:x}}}" for c in sorted(badness_triggers()[2]) if c not in SURROGATES) + "]"


def needs_ftfy(line: str) -> bool:
    """Whether ftfy could change this line (a C1 control, a surrogate, or a badness match); False: it would not."""
    triggers, longest, _ = badness_triggers()
    found = triggers.search(line)
    if found is None:
        return False
    from ftfy.badness import BADNESS_RE

    tried = -1
    for hit in triggers.finditer(line, found.start()):
        char = ord(hit.group())
        if char in C1_CONTROLS or char in SURROGATES:
            return True
        for start in range(max(tried + 1, hit.start() - longest + 1), hit.start() + 1):
            if BADNESS_RE.match(line, start):
                return True
        tried = hit.start()
    return False


def repair_mojibake(text: str) -> str:
    """ftfy's encoding repair, line by line as `ftfy.fix_text` segments a text; ftfy runs on the lines it could change."""
    if text.isascii():
        return text
    config = mojibake_config()
    out, pos = [], 0
    while pos < len(text):
        end = text.find("\n", pos) + 1 or len(text)
        end = min(end, pos + config.max_decode_length)
        segment = text[pos:end]
        if segment.isascii() or not needs_ftfy(segment):
            out.append(segment)
        else:
            import ftfy

            out.append(ftfy.fix_and_explain(segment, config).text)
        pos = end
    return "".join(out)
