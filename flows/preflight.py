"""Checks that a command can start, made in the CLI process before Prefect or torch is imported.

A missing source path, a typo in a config key or a locked run directory used to surface only after the
Prefect server and the flow had started (one to two minutes), and left `config.json` and a cache folder
behind. Here they end the command within a second, in one line, having written nothing: every check
only reads (a glob stops at its first match; no directory is made), but the last: `run` and `rerun` take
the run directory's lock here, atomically, and hold it for the whole command, so of two runs started at
once on one directory the second is refused here, before Prefect starts.

What is checked, by command: `run` and `serve` the pipeline config (its keys, with the nearest valid key
for a typo, and its values), `--set` overrides, every source spec, each local source's path and glob,
model and tokenizer files, `--until`, the run directory (never a URL) and its lock; `rerun` the run
directory, its stage and lock; `train` the recipe's keys and values, the corpus, the output directory;
commands that read a checkpoint, that it exists (a missing file is "missing", not "corrupt").
"""
from __future__ import annotations

import argparse
import dataclasses
import difflib
import os
import re
import sys
import typing
from pathlib import Path
from typing import Any, Callable

URL_RE = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")


class PreflightError(Exception):
    """A command cannot start: `message` names the file, key or path; `fix` says what to do."""

    def __init__(self, message: str, fix: str):
        super().__init__(message)
        self.message, self.fix = message, fix

    def line(self) -> str:
        return f"hymo: {self.message} — fix: {self.fix}"


# --- config keys -----------------------------------------------------------------------------------------------

def fields_of(tp: Any) -> dict[str, Any] | None:
    """{key: type} of a dataclass or pydantic model; None for anything else (its keys are not checked here)."""
    from pydantic import BaseModel

    if isinstance(tp, type) and issubclass(tp, BaseModel):
        return {name: field.annotation for name, field in tp.model_fields.items()}
    if isinstance(tp, type) and dataclasses.is_dataclass(tp):
        try:
            hints = typing.get_type_hints(tp)
        except Exception:  # an annotation this check cannot resolve: the field is taken as a plain value
            hints = {}
        return {f.name: hints.get(f.name) for f in dataclasses.fields(tp)}
    return None


EXTRA_KEYS = {"ModelConfig": {"preset"}}  # `preset = "hymo-tiny"` in a [model] table (hymo_core.models.presets)


def unknown_keys(table: dict[str, Any], tp: Any, where: list[str]) -> list[tuple[str, str, str | None]]:
    """(table name, unknown key, nearest known key or None) for every key of `table` (and its sub-tables) that
    `tp` does not have."""
    known = fields_of(tp)
    if known is None or not isinstance(table, dict):
        return []
    allowed = set(known) | EXTRA_KEYS.get(getattr(tp, "__name__", ""), set())
    found = []
    for key, value in table.items():
        if key not in allowed:
            near = difflib.get_close_matches(key, sorted(allowed), n=1, cutoff=0.6) or nested_key(key, known, where)
            found.append((".".join(where), key, near[0] if near else None))
            continue
        sub = known.get(key)
        if isinstance(value, dict):
            found += unknown_keys(value, sub, where + [key])
        elif isinstance(value, list) and typing.get_origin(sub) is list:
            (item_type,) = typing.get_args(sub) or (None,)
            for item in value:
                found += unknown_keys(item, item_type, where + [key])
    return found


def nested_key(key: str, known: dict[str, Any], where: list[str]) -> list[str]:
    """`max_steps` under [pretrain] is [pretrain.train]'s: the full dotted path of a sub-table's field of that name."""
    return [".".join(where + [sub, key]) for sub, tp in known.items() if key in (fields_of(tp) or {})][:1]


def pipeline_key_errors(raw: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    """Unknown keys of a pipeline TOML: its [run] table holds PipelineConfig's plain fields, every other table a section."""
    from flows.config import PipelineConfig

    sections = {name: tp for name, tp in fields_of(PipelineConfig).items()}
    plain = {name for name, tp in sections.items() if fields_of(tp) is None and name != "filters"}  # sources, workers, ...
    found = []
    for key, value in raw.items():
        if key == "run" and isinstance(value, dict):
            for sub in value:
                if sub not in plain:
                    near = difflib.get_close_matches(sub, sorted(plain), n=1, cutoff=0.6)
                    found.append(("run", sub, near[0] if near else None))
        elif key not in sections:
            near = difflib.get_close_matches(key, sorted(set(sections) | {"run"}), n=1, cutoff=0.6)
            found.append(("", key, near[0] if near else None))
        elif isinstance(value, dict):
            found += unknown_keys(value, sections[key], [key])
        elif isinstance(value, list) and typing.get_origin(sections[key]) is list:
            (item_type,) = typing.get_args(sections[key]) or (None,)
            for item in value:
                found += unknown_keys(item, item_type, [key])
    return found


def key_error(where: str, found: list[tuple[str, str, str | None]]) -> PreflightError:
    table, key, near = found[0]
    place = f"[{table}] has no key {key!r}" if table else f"no table or key {key!r}"
    hint = f"; did you mean {near!r}?" if near else ""
    more = f" (and {len(found) - 1} more unknown keys)" if len(found) > 1 else ""
    return PreflightError(f"{where}: {place}{hint}{more}", f"rename it{f' to {near!r}' if near else ''}, or remove it")


def check_overrides(overrides: list[str] | None, errors_of: Callable[[dict], list]) -> None:
    from hymo_core.overrides import OverrideError, apply_overrides, parse_override

    for text in overrides or ():
        try:
            alone = apply_overrides({}, [text])
        except OverrideError as exc:
            raise PreflightError(str(exc), "write it as --set section.key=value") from None
        found = errors_of(alone)
        if found:
            raise key_error(f"--set {text}", found)
        path, value = parse_override(text)
        problem = range_problem(path[-1], value)
        if problem:
            raise PreflightError(f"--set {text}: {problem}", "give a value in range")


def range_problem(name: str, value: Any) -> str | None:
    """What is out of range in a number set for `name`: every count, threshold, size and time in a HyMo config is >= 0,
    and a fraction is at most 1. None: in range (or not a number)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if value < 0:
        return f"{name} cannot be negative (got {value})"
    if "fraction" in name and value > 1:
        return f"{name} is a fraction, at most 1 (got {value})"
    return None


def shadowed_overrides(config: Any, overrides: list[str] | None) -> list[str]:
    """One line per `--set quality.KEY=...` that a quality profile overrides with its own value: the value does not reach
    that profile's documents, and the run would otherwise record it without saying so."""
    from hymo_core.overrides import parse_override

    lines = []
    for text in overrides or ():
        path, value = parse_override(text)
        if len(path) != 2 or path[0] != "quality":
            continue
        keeping = [f"{profile} keeps {rules[path[1]]!r}" for profile, rules in sorted(config.quality.profiles.items())
                   if path[1] in rules and rules[path[1]] != value]
        if keeping:
            lines.append(f"--set {text} does not reach every quality profile: {', '.join(keeping)} (quality.profiles; a "
                         "[quality.profiles] table replaces them all, docs/quality.md)")
    return lines


def validation_line(exc: Exception) -> str:
    """A pydantic ValidationError's first error as `[section] key: what is wrong (got VALUE)`."""
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return " ".join(str(exc).split())
    first = errors()[0]
    loc = [str(part) for part in first.get("loc", ())]
    place = f"[{'.'.join(loc[:-1])}] {loc[-1]}" if len(loc) > 1 else (loc[0] if loc else "config")
    more = f" (and {len(errors()) - 1} more)" if len(errors()) > 1 else ""
    return f"{place}: {first.get('msg')} (got {first.get('input')!r}){more}"


def check_pipeline_config(path: str | None, overrides: list[str] | None):
    """The PipelineConfig `hymo run`/`serve` would use, or PreflightError naming the file (or --set) and the key."""
    from flows.config import SAMPLE_CONFIG, load_config, read_config_tables

    where = str(path or SAMPLE_CONFIG)
    if path is not None and not Path(path).is_file():
        raise PreflightError(f"--config {path}: no such file", "check the path (a relative path is read from the current directory)")
    try:
        _, raw = read_config_tables(path)
    except ValueError as exc:
        raise PreflightError(" ".join(str(exc).split()), "fix the TOML at the line named") from None
    found = pipeline_key_errors(raw)
    if found:
        raise key_error(where, found)
    check_overrides(overrides, pipeline_key_errors)
    try:
        config = load_config(path, overrides)
    except Exception as exc:  # pydantic's ValidationError, a stage config's own ValueError, a preset's
        raise PreflightError(f"{where}{' with --set' if overrides else ''}: {validation_line(exc)}",
                             "fix the value named above") from None
    for line in shadowed_overrides(config, overrides):
        print(f"hymo: note: {line}", file=sys.stderr)
    return config


# --- sources and files -----------------------------------------------------------------------------------------

def first_match(root: Path, pattern: str) -> bool:
    """Whether any file under `root` matches the source glob; stops at the first (a crawl's tree is not listed twice)."""
    from tasks.ingest.source_walk import glob_match

    wanted = [p for p in pattern.split("/") if p]
    for current, dirnames, filenames in os.walk(root, followlinks=True):
        dirnames.sort()
        for name in filenames:
            if glob_match((Path(current) / name).relative_to(root).parts, wanted):
                return True
    return False


def check_source(spec: Any) -> None:
    from tasks.ingest.ingest import source_pattern
    from tasks.ingest.source_fs import is_url

    if is_url(spec.path):  # listing a bucket needs the network: only whether fsspec can open that kind of URL
        protocol = spec.path.split("://", 1)[0]
        try:
            import fsspec

            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as exc:
            raise PreflightError(f"source {spec.name}: {spec.path}: no fsspec filesystem for {protocol}:// ({exc})",
                                 f"install the package for {protocol}:// (s3fs for s3://, gcsfs for gs://)") from None
        return
    root = spec.root
    if not root.exists():
        raise PreflightError(f"source {spec.name}: path {root} does not exist", "fix the spec's path (relative paths are read from the spec's directory)")
    if root.is_file() or spec.kind == "hf_disk":
        return
    pattern = source_pattern(spec)
    if not first_match(root, pattern):
        raise PreflightError(f"source {spec.name}: no file under {root} matches glob {pattern!r}",
                             "fix the spec's glob or path (a glob is matched against paths relative to the path)")


def check_source_names(config: Any, specs: list[Any]) -> None:
    """Two specs with one `name`: ingestion would read only the first (the name prefixes every document id and
    keys the source in corpus.json), so the second source's documents would vanish without a record."""
    from manifests.sources import spec_path

    base = Path(config.config_dir) if config.config_dir else None
    first: dict[str, Any] = {}
    for entry, spec in zip(config.sources, specs):
        if spec.name in first and (spec != first[spec.name][1] or spec.root != first[spec.name][1].root):
            raise PreflightError(f"two sources are named {spec.name!r}: {first[spec.name][0]} and {spec_path(entry, base)}",
                                 "give each source spec its own `name`")
        first.setdefault(spec.name, (spec_path(entry, base), spec))


def check_file(path: str | Path, what: str) -> None:
    if not Path(path).exists():
        raise PreflightError(f"{path}: {what} missing (no such file)", "check the path (a relative path is read from the current directory)")


def check_pipeline_inputs(config: Any, until: str | None) -> None:
    """Every source spec and its files, the model and tokenizer files the config names, the user filters, --until."""
    from flows.stages import pipeline_stages
    from manifests.sources import SourceSpecError
    from tasks.filters.user_filter import UserFilterError

    try:
        specs = config.source_specs()
    except SourceSpecError as exc:
        raise PreflightError(" ".join(str(exc).split()), "fix the source spec named above") from None
    check_source_names(config, specs)
    for spec in specs:
        check_source(spec)
    if config.langid.model_path:
        check_file(config.langid.model_path, "language-ID model (langid.model_path)")
    if config.quality_model.enabled and config.quality_model.model_path:
        check_file(config.quality_model.model_path, "quality classifier (quality_model.model_path)")
    if config.tokenizer.from_file:
        check_file(config.tokenizer.from_file, "tokenizer (tokenizer.from_file)")
    if config.pretrain.cloze:
        check_file(config.pretrain.cloze, "cloze set (pretrain.cloze)")
    try:
        names = [entry.name for entry in pipeline_stages(config)]  # also imports each [[filters]] function
    except (UserFilterError, ValueError) as exc:
        raise PreflightError(" ".join(str(exc).split()), "fix the [[filters]] table named above") from None
    if until is not None and until not in names:
        near = difflib.get_close_matches(until, names, n=1)
        raise PreflightError(f"--until {until}: not a stage of this pipeline ({', '.join(names)})"
                             + (f"; did you mean {near[0]!r}?" if near else ""), "name one of the stages listed")


# --- run directories --------------------------------------------------------------------------------------------

def check_run_directory(path: str | Path, flag: str) -> Path:
    """A local (or mounted) directory that can be created or written; never a URL (`--out s3://b/x` made ./s3:/b/x)."""
    text = str(path)
    if URL_RE.match(text):
        raise PreflightError(f"{flag} {text}: a run directory must be a local or mounted path, not a URL (only sources may be URLs)",
                             "write the run to a local disk or a shared POSIX file system (NFS, Lustre) and copy the finished directory to "
                             "the bucket; docs/your-data.md, section 6 \"What the run directory's storage must support\", says why (object-store "
                             "FUSE mounts lack atomic rename and flock)")
    run = Path(text).resolve()
    if run.exists() and not run.is_dir():
        raise PreflightError(f"{flag} {run}: is a file, not a directory", "choose another path")
    existing = next(p for p in [run, *run.parents] if p.exists())
    if not existing.is_dir() or not os.access(existing, os.W_OK | os.X_OK):
        raise PreflightError(f"{flag} {run}: {existing} is not a writable directory", "choose a path you can write, or fix its permissions")
    return run


def check_unlocked(run: Path) -> None:
    """Refuse a directory another process holds now, taking nothing (the command's own process takes the lock)."""
    from manifests.run_lock import WAIT_ENV, current_holder

    if float(os.environ.get(WAIT_ENV, "0") or 0) > 0:
        return  # the user asked the run to wait for the lock
    holder = current_holder(run)
    if holder is not None:
        raise PreflightError(f"{run}: in use by {holder}",
                             f"wait for the other run to finish, stop it, or use another --out directory (set {WAIT_ENV}=SECONDS to wait)")


def take_lock(run: Path) -> None:
    """Take the run directory's lock for the whole command, atomically (flock): of two commands started at once,
    one holds it and the other ends here, before Prefect starts, having written nothing. The last check, since it
    creates the directory and RUN/.lock (the run would). $HYMO_RUN_LOCK_WAIT_S > 0: wait that long for it."""
    from manifests.run_lock import LOCK_NAME, WAIT_ENV, RunLocked, holder_of, hold_run_lock

    try:
        hold_run_lock(run)
    except RunLocked:
        raise PreflightError(f"{run}: in use by {holder_of(run / LOCK_NAME)}",
                             f"wait for the other run to finish, stop it, or use another --out directory (set {WAIT_ENV}=SECONDS to wait)") from None


# --- per command -------------------------------------------------------------------------------------------------

def check_run(args: argparse.Namespace) -> None:
    from flows.config import default_run

    run = check_run_directory(args.out, "--out") if args.out else default_run()
    config = check_pipeline_config(args.config, args.set)
    check_pipeline_inputs(config, args.until)
    take_lock(run)


def check_rerun(args: argparse.Namespace) -> None:
    from flows.config import RUN_CONFIG, load_run_config

    run = check_run_directory(args.run, "RUN")
    if not (run / RUN_CONFIG).is_file():
        raise PreflightError(f"{run}: no {RUN_CONFIG}; was this directory written by `hymo run`?",
                             "pass the directory `hymo run --out` wrote (default: $HYMO_HOME/runs/sample)")
    try:
        config = load_run_config(run)
    except Exception as exc:
        raise PreflightError(f"{run / RUN_CONFIG}: {validation_line(exc)}", "re-run `hymo run` on this directory to rewrite it") from None
    from flows.stages import pipeline_stages

    names = [entry.name for entry in pipeline_stages(config, import_functions=False)]
    for flag, stage in (("--stage", args.stage), ("--until", args.until)):
        if stage is not None and stage not in names:
            near = difflib.get_close_matches(stage, names, n=1)
            raise PreflightError(f"{flag} {stage}: not a stage of {run} ({', '.join(names)})" + (f"; did you mean {near[0]!r}?" if near else ""),
                                 "name one of the stages listed")
    check_rerun_overrides(run, config, names, args.stage, getattr(args, "set", None))
    take_lock(run)


def check_rerun_overrides(run: Path, config: Any, names: list[str], stage: str, overrides: list[str] | None) -> None:
    """`rerun --set`: the keys and values `run --set` accepts, on the run's saved config; and no value of a stage
    before --stage (the rerun would not recompute it, and config.json would describe outputs it did not make)."""
    from flows.config import RUN_CONFIG, with_overrides
    from hymo_core.overrides import parse_override

    check_overrides(overrides, pipeline_key_errors)
    try:
        with_overrides(config, overrides)
    except Exception as exc:  # pydantic's ValidationError, a stage config's own ValueError
        raise PreflightError(f"{run / RUN_CONFIG} with --set: {validation_line(exc)}", "fix the value named above") from None
    for text in overrides or ():
        section = parse_override(text)[0][0]
        if section in names and names.index(section) < names.index(stage):
            raise PreflightError(f"--set {text}: changes {section}, which comes before --stage {stage} and would not be recomputed",
                                 f"rerun from it: hymo rerun {run} --stage {section} --set {text}")


def recipe_key_errors(raw: dict[str, Any]) -> list[tuple[str, str, str | None]]:
    from hymo_core.models.configs import ModelConfig
    from hymo_core.train.config import TrainConfig
    from hymo_core.train.recipe import PARALLEL_KEYS, RECIPE_TABLES

    found = []
    for key, value in raw.items():
        if key not in RECIPE_TABLES:
            near = difflib.get_close_matches(key, RECIPE_TABLES, n=1, cutoff=0.6)
            found.append(("", key, near[0] if near else None))
        elif key == "train":
            found += unknown_keys(value, TrainConfig, ["train"])
        elif key == "model":
            found += unknown_keys(value, ModelConfig, ["model"])
        elif key == "parallel" and isinstance(value, dict):
            found += [("parallel", k, (difflib.get_close_matches(k, PARALLEL_KEYS, n=1) or [None])[0]) for k in value if k not in PARALLEL_KEYS]
    return found


def check_train(args: argparse.Namespace) -> None:
    from hymo_core.train.recipe import load_run_config, read_recipe_tables

    check_unlocked(check_run_directory(args.out, "--out"))  # another training run holds --out: refused before torch loads
    if URL_RE.match(args.corpus) or not Path(args.corpus).exists():
        raise PreflightError(f"--corpus {args.corpus}: no such run directory, shards directory or corpus.json",
                             "pass a run directory `hymo run` wrote (or its NN_shards directory)")
    if args.config is not None and not Path(args.config).is_file():
        raise PreflightError(f"--config {args.config}: no such file", "check the path (a relative path is read from the current directory)")
    try:
        raw = read_recipe_tables(args.config)
    except ValueError as exc:
        raise PreflightError(" ".join(str(exc).split()), "fix the TOML at the line named") from None
    found = recipe_key_errors(raw)
    if found:
        raise key_error(args.config, found)
    check_overrides(args.set, recipe_key_errors)
    try:
        load_run_config(args.config, args.set)
    except (ValueError, TypeError) as exc:
        raise PreflightError(" ".join(str(exc).split()), "fix the value named above") from None
    if args.cloze:
        check_file(args.cloze, "cloze set (--cloze)")


def check_serve(args: argparse.Namespace) -> None:
    if args.run_root:
        check_run_directory(args.run_root, "--run-root")
    if args.home:
        check_run_directory(args.home, "--home")
    config = check_pipeline_config(args.config, args.set)
    check_pipeline_inputs(config, None)


def check_checkpoint(path: str) -> None:
    """Before torch is imported: a checkpoint that is not there is missing (the loader would call it corrupt)."""
    if not Path(path).exists():
        raise PreflightError(f"{path}: checkpoint missing (no such file or directory)",
                             "check the path; a run's checkpoints are in RUN/NN_pretrain/checkpoints/ (or OUT/checkpoints/ of `hymo train`)")


def check_checkpoints(args: argparse.Namespace) -> None:
    for name in ("checkpoint", "checkpoints", "base"):
        value = getattr(args, name, None)
        for path in ([value] if isinstance(value, str) else value or []):
            check_checkpoint(path)


CHECKS: dict[str, Callable[[argparse.Namespace], None]] = {
    "run": check_run, "rerun": check_rerun, "train": check_train, "serve": check_serve,
    "eval": check_checkpoints, "generate": check_checkpoints, "export": check_checkpoints, "average": check_checkpoints,
    "cpt run": check_checkpoints,
}


def preflight(args: argparse.Namespace) -> None:
    """Raise PreflightError if the parsed command cannot start; imports neither Prefect nor torch."""
    command = args.command + (f" {args.cpt_command}" if getattr(args, "cpt_command", None) else "")
    check = CHECKS.get(command)
    if check is not None:
        check(args)
