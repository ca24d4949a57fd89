"""A digest of the code a stage's decisions depend on, folded into its cache key.

A hand-bumped `VERSION` is forgotten (every stage said "1" through many rule
changes), so an upgraded HyMo kept serving old decisions from an existing run
directory. Here the stage's own module (`stage_module`) and every `tasks.*`
/ `hymo_core.*` module it imports, directly or not (imports inside functions
included), are parsed and their syntax trees hashed: a changed rule, threshold
or model changes the key, so that stage recomputes, and every stage after it
sees a new input digest and recomputes too. Comments and formatting do not
count (they are not in the tree). The shared plumbing (manifests, writers,
the watchdog) is left out: it changes how a stage runs, not what it decides.
"""
from __future__ import annotations

import ast
import functools
import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RULE_PACKAGES = ("tasks", "hymo_core")
PLUMBING = {"tasks.runner.stage_runner", "tasks.runner.code_version", "tasks.ingest.watchdog", "tasks.runner.rule_digest"}
STAGE_PACKAGES = ("ingest", "filters", "dedup", "corpus")  # tasks/__init__.py: where a stage module lives


def module_path(name: str) -> Path | None:
    """The source file of a project module, or None when it is not one (or does not exist)."""
    if name.split(".")[0] not in RULE_PACKAGES:
        return None
    base = REPO.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def module_source(name: str) -> str | None:
    path = module_path(name)
    return path.read_text(encoding="utf-8") if path else None


def imported_modules(name: str, tree: ast.AST) -> set[str]:
    """Project modules `tree` imports anywhere (top level or inside functions)."""
    return {m for m in imported_names(name, tree) if module_path(m) is not None and m not in PLUMBING}


def imported_names(name: str, tree: ast.AST) -> set[str]:
    """Every module name `tree` imports anywhere, project module or not (which ones exist is asked each run)."""
    found: set[str] = set()
    package = name.rsplit(".", 1)[0] if "." in name else name
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)  # `from hymo_core import model`
    return found


@functools.cache
def parsed_module(name: str) -> tuple[frozenset[str], str]:
    """(project modules it imports, sha256 of its syntax tree): each module parsed once per process, and once per
    source text and Python version across processes (TREES): parsing every stage's modules cost a run ~1 s of
    CPU before its stages' task runs, the same trees every run."""
    source = module_source(name) or ""
    key = f"{sys.version_info[0]}.{sys.version_info[1]}:{name}:{hashlib.sha256(source.encode()).hexdigest()}"
    trees = known_trees()
    if key not in trees:
        tree = ast.parse(source)
        trees[key] = [sorted(imported_names(name, tree)), hashlib.sha256(ast.dump(tree).encode()).hexdigest()]
        NEW_TREES.add(key)
    names, digest = trees[key]
    return frozenset(m for m in names if module_path(m) is not None and m not in PLUMBING), digest


def trees_file() -> Path:
    """$XDG_CACHE_HOME/hymo/rule-trees.json (~/.cache when unset): (Python version, module, source sha256) ->
    (the names it imports, its syntax tree's sha256). Only a cache: unreadable or absent, trees are parsed again."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "hymo" / "rule-trees.json"


TREES: dict[str, list] = {}
NEW_TREES: set[str] = set()


def known_trees() -> dict[str, list]:
    if not TREES and not NEW_TREES:
        try:
            TREES.update(json.loads(trees_file().read_text(encoding="utf-8")))
        except (OSError, ValueError):
            pass
    return TREES


def save_trees() -> None:
    """Write the trees parsed by this process, with those of the current sources only (old ones are dropped)."""
    if not NEW_TREES:
        return
    from manifests.atomic import atomic_write_text

    fresh = {key.rsplit(":", 1)[0] for key in NEW_TREES}  # "3.11:tasks.filters.c4": parsed now from its current source
    current = {key: value for key, value in TREES.items() if key in NEW_TREES or key.rsplit(":", 1)[0] not in fresh}
    try:
        trees_file().parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(trees_file(), json.dumps(current, sort_keys=True))
    except OSError:
        return
    NEW_TREES.clear()


def stage_module(stage: str) -> str | None:
    """The module of stage `stage` by the rule in tasks/__init__.py: `tasks.<package>.<stage>`, or
    `tasks.<package>.<rest>` for a stage named `<package>_<rest>`, or `tasks.<stage>`; None if there is none."""
    candidates = [f"tasks.{package}.{stage}" for package in STAGE_PACKAGES]
    package, _, rest = stage.partition("_")
    if package in STAGE_PACKAGES and rest:
        candidates.append(f"tasks.{package}.{rest}")
    candidates.append(f"tasks.{stage}")
    return next((name for name in candidates if module_path(name) is not None), None)


def rule_modules(stage: str) -> list[str]:
    """The stage's module and the project modules it depends on, sorted; [] for a stage with no such module."""
    start = stage_module(stage)
    if start is None:
        return []
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        todo.extend(parsed_module(name)[0])
    return sorted(seen)


@functools.cache
def rule_digest(stage: str) -> str:
    """sha256 over (module name, syntax tree) of every module in `rule_modules(stage)`; '' when there are none."""
    modules = rule_modules(stage)
    if not modules:
        return ""
    digest = hashlib.sha256()
    for name in modules:
        digest.update(f"{name}\0{parsed_module(name)[1]}\0".encode())
    save_trees()
    return digest.hexdigest()
