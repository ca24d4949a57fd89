"""User-defined filter stages: a function named in the config decides keep/drop per document.

```toml
[[filters]]
name = "no_lorem"                     # the stage's name (directory, audit rows, funnel)
after = "quality"                     # the stage it follows
function = "my_filters:no_lorem"      # (text, meta) -> Decision(keep, rule, value, threshold)
```

The function answers; this module does the rest under the same contract as
every built-in stage: one audit row per removal with the function's rule,
value and threshold, conservation checked per shard, shards mapped over the
runner, atomic publish. The cache key includes the sha256 of the function's
module source, so editing the plugin recomputes the stage. A function that
raises, or returns anything but a `Decision` whose `keep` is a real bool, fails the stage with the plugin
name and the document id; nothing of that stage is published.
"""
from __future__ import annotations

import hashlib
import importlib
import inspect
import json
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import pyarrow as pa

from tasks.runner.stage_runner import ShardOutcome, StageDef

VERSION = "1"
NAME_RE = re.compile(r"^[a-z][a-z0-9_]*$")


@dataclass(frozen=True)
class Decision:
    """A filter's answer about one document. `rule` names the failure (e.g. "no_lorem_ipsum") when keep is False."""

    keep: bool
    rule: str = ""
    value: float | None = None  # what was measured
    threshold: float | None = None  # the limit it was compared with


@dataclass(frozen=True)
class UserFilterConfig:
    name: str
    after: str
    function: str  # "module:function", importable from sys.path or from `path`
    path: str = ""  # a directory searched first for the module (the pipeline fills in the config's directory)


class UserFilterError(RuntimeError):
    """A user filter cannot be imported, raised on a document, or returned something that is not a Decision."""


def load_function(config: UserFilterConfig) -> Callable[[str, dict[str, Any]], Decision]:
    module_name, sep, attribute = config.function.partition(":")
    if not sep or not module_name or not attribute:
        raise UserFilterError(f"filter {config.name!r}: function must read 'module:function', got {config.function!r}")
    if config.path and config.path not in sys.path:
        sys.path.insert(0, config.path)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # an import error or anything the module raises at import time
        raise UserFilterError(f"filter {config.name!r}: cannot import module {module_name!r} of {config.function!r}: {type(exc).__name__}: {exc}") from exc
    function = getattr(module, attribute, None)
    if not callable(function):
        raise UserFilterError(f"filter {config.name!r}: {module_name!r} has no function {attribute!r} ({config.function!r})")
    return function


def source_digest(config: UserFilterConfig) -> list[tuple[str, str]]:
    """sha256 of the plugin's module source: part of the stage's cache key."""
    function = load_function(config)
    module = inspect.getmodule(function)
    source = inspect.getsource(module) if module is not None else inspect.getsource(function)
    return [(f"filter:{config.function}", hashlib.sha256(source.encode("utf-8")).hexdigest())]


def check_decision(config: UserFilterConfig, doc_id: str, decision: Any) -> Decision:
    if not isinstance(decision, Decision):
        raise UserFilterError(f"filter {config.name!r} ({config.function}) returned {type(decision).__name__} for document {doc_id}; "
                              "it must return tasks.filters.user_filter.Decision(keep, rule, value, threshold)")
    if not isinstance(decision.keep, bool):  # Decision(keep="no") would otherwise be a silent keep
        raise UserFilterError(f"filter {config.name!r} ({config.function}) returned Decision(keep={decision.keep!r}) for document {doc_id}; "
                              f"keep must be True or False, not {type(decision.keep).__name__}")
    if not decision.keep and not decision.rule:
        raise UserFilterError(f"filter {config.name!r} ({config.function}) removed document {doc_id} without a rule name")
    return decision


def user_filter_shard(docs: pa.Table, config: UserFilterConfig, context: Any = None) -> ShardOutcome:
    function = load_function(config)
    keep_mask: list[bool] = []
    audit: list[dict[str, Any]] = []
    for doc_id, text, meta in zip(docs.column("id").to_pylist(), docs.column("text").to_pylist(), docs.column("meta").to_pylist()):
        try:
            answer = function(text, json.loads(meta))
        except Exception as exc:
            raise UserFilterError(f"filter {config.name!r} ({config.function}) failed on document {doc_id}: {type(exc).__name__}: {exc}") from exc
        decision = check_decision(config, doc_id, answer)
        keep_mask.append(decision.keep)
        if not decision.keep:
            audit.append({"id": doc_id, "action": "removed", "rule": decision.rule, "value": decision.value, "threshold": decision.threshold,
                          "detail": {"filter": config.name, "function": config.function}})
    return ShardOutcome(docs.filter(pa.array(keep_mask, pa.bool_())), audit)


def user_filter_stage(config: UserFilterConfig) -> StageDef:
    if not NAME_RE.match(config.name):
        raise UserFilterError(f"filter name {config.name!r}: lowercase letters, digits and underscores, starting with a letter")
    return StageDef(config.name, VERSION, user_filter_shard, external_inputs=source_digest)


def plugin_path_default(config: UserFilterConfig, config_dir: str | None) -> UserFilterConfig:
    """A relative module is looked up next to the pipeline config unless the filter names its own path."""
    if config.path or not config_dir:
        return config
    return UserFilterConfig(config.name, config.after, config.function, str(Path(config_dir)))
