"""`--set section.key=value` on the command line, applied to a TOML config's tables before it is validated.

The torchtitan habit: the TOML is the recipe, a flag changes one value of it for this run. The value is
read as a TOML value (`20`, `0.5`, `true`, `["en", "zh"]`, `"text"`); a bare word that is not one stays a string.
"""
from __future__ import annotations

import tomllib
from typing import Any


class OverrideError(ValueError):
    """A `--set` argument is not `dotted.key=value`."""


def parse_override(text: str) -> tuple[list[str], Any]:
    key, sep, raw = text.partition("=")
    path = [part.strip() for part in key.split(".")]
    if not sep or not all(path):
        raise OverrideError(f"--set {text!r}: expected section.key=value (e.g. --set pretrain.train.max_steps=50)")
    try:
        value = tomllib.loads(f"v = {raw.strip()}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw.strip()  # `--set tokenizer.name=mine`: a bare word is a string
    return path, value


def apply_overrides(raw: dict[str, Any], overrides: list[str] | tuple[str, ...] | None) -> dict[str, Any]:
    """`raw` (a parsed TOML document) with each override set, creating tables on the way; later ones win."""
    for text in overrides or ():
        path, value = parse_override(text)
        table = raw
        for part in path[:-1]:
            table = table.setdefault(part, {})
            if not isinstance(table, dict):
                raise OverrideError(f"--set {text!r}: {part} is a value, not a table")
        table[path[-1]] = value
    return raw
