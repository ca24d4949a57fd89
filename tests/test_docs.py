"""Docs that run: every `hymo` command line the README and docs/ show names a real subcommand and real flags,
every stage directory they name has the number the pipeline gives it, every repository path they name exists,
and every shell block marked runnable runs on the bundled sample.

A block is runnable when the line before its fence is `<!-- runnable -->`. Its lines run in order in one shell,
in a scratch directory that is also $HYMO_HOME, with `hymo` and `.venv/bin/hymo` being this checkout's CLI;
every block shares that directory (one sample run for all of them), in README-then-docs order. A block whose
lines start with `$ ` (a transcript) runs only those lines. Each command must exit 0.
"""
from __future__ import annotations

import argparse
import os
import re
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import build_parser, subcommands

REPO = Path(__file__).resolve().parents[1]
DOCS = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), REPO / "infra" / "README.md"]
RUNNABLE = "<!-- runnable -->"
FENCE = re.compile(r"^```(\w*)\s*$")
HYMO_LINE = re.compile(r"^\s*(?:\$\s+)?(?:\S*/)?hymo\s+(.*)$")
STAGE_DIR = re.compile(r"\b(\d\d)_([a-z][a-z_]*[a-z])\b")
REPO_PATH = re.compile(r"`((?:flows|tasks|manifests|hymo_core|docs|infra|bench|tests|examples)/[A-Za-z0-9_./-]*)`")


def code_blocks(path: Path) -> list[tuple[int, str, bool, list[str]]]:
    """(first line number, language, runnable, lines) of each fenced block."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, inside, start, language, marked, body = [], False, 0, "", False, []
    for number, line in enumerate(lines, start=1):
        match = FENCE.match(line.strip()) if line.strip().startswith("```") else None
        if match is not None and not inside:
            inside, start, language, body = True, number, match.group(1), []
            marked = number >= 2 and lines[number - 2].strip() == RUNNABLE
        elif line.strip() == "```" and inside:
            inside = False
            blocks.append((start, language, marked, body))
        elif inside:
            body.append(line)
    return blocks


def joined(lines: list[str]) -> list[str]:
    """Lines with `\\` continuations joined."""
    out: list[str] = []
    for line in lines:
        if out and out[-1].endswith("\\"):
            out[-1] = out[-1][:-1] + " " + line.strip()
        else:
            out.append(line)
    return out


def hymo_command_lines() -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for start, language, _, body in code_blocks(path):
            if language not in ("", "bash", "sh", "console", "shell"):
                continue
            for line in joined(body):
                match = HYMO_LINE.match(line)
                if match and not line.lstrip().startswith("#"):
                    found.append((f"{path.relative_to(REPO)}:{start}", match.group(1).split(" #")[0]))
    return found


def options_of(parser: argparse.ArgumentParser) -> set[str]:
    return {option for action in parser._actions for option in action.option_strings}


def surplus_positionals(parser: argparse.ArgumentParser, tokens: list[str]) -> list[str]:
    """Positional words beyond what the parser's positional arguments take (`audit sample RUN quality`: `quality`)."""
    takes_value = {option for action in parser._actions for option in action.option_strings if action.nargs != 0}
    words, skip = [], False
    for token in tokens:
        if skip:
            skip = False
            continue
        if token.startswith("-"):
            skip = token in takes_value and "=" not in token
            continue
        words.append(token)
    positionals = [action for action in parser._actions if not action.option_strings and not isinstance(action, argparse._SubParsersAction)]
    if any(action.nargs in ("+", "*", argparse.REMAINDER) for action in positionals):
        return []
    return words[len(positionals):]


def test_every_hymo_line_in_the_docs_names_a_real_subcommand_and_real_flags() -> None:
    root = build_parser()
    lines = hymo_command_lines()
    assert len(lines) > 40  # the docs show many; a parsing slip that finds none must fail
    problems = []
    for where, text in lines:
        try:
            tokens = shlex.split(text.replace("[", " ").replace("]", " "))
        except ValueError:
            tokens = text.split()
        tokens = [token.split("|")[0] for token in tokens if token not in ("|", "...", "…")]  # `a|b`: one of the choices
        parser, path = root, ["hymo"]
        for token in tokens:
            children = {name: child for name, _, child in subcommands(parser)}
            if not children or token.startswith("-"):
                break
            if token not in children:
                problems.append(f"{where}: `hymo {text.strip()}`: no subcommand {token!r} under `{' '.join(path)}`")
                break
            parser, path = children[token], path + [token]
        known = options_of(parser) | options_of(root) | {"--debug"}
        for token in tokens:
            flag = token.split("=")[0]
            if re.fullmatch(r"--[a-z][a-z0-9-]*", flag) and flag not in known:
                problems.append(f"{where}: `hymo {text.strip()}`: {' '.join(path)} has no option {flag}")
        extra = surplus_positionals(parser, tokens[len(path) - 1:])
        if extra:
            problems.append(f"{where}: `hymo {text.strip()}`: {' '.join(path)} takes no positional {extra!r} (a missing --flag?)")
    assert not problems, "\n".join(problems)


def test_stage_directories_in_the_docs_carry_their_pipeline_number() -> None:
    from flows.config import load_config
    from flows.stages import pipeline_stages, stage_dir_names

    numbers = {stage: name.split("_", 1)[0] for stage, name in stage_dir_names(pipeline_stages(load_config())).items()}
    problems = []
    for path in DOCS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for digits, stage in STAGE_DIR.findall(line):
                if stage in numbers and digits != numbers[stage]:
                    problems.append(f"{path.relative_to(REPO)}:{number}: {digits}_{stage}, but the pipeline writes {numbers[stage]}_{stage}")
    assert not problems, "\n".join(problems)


def test_repository_paths_named_in_the_docs_exist() -> None:
    problems = []
    for path in DOCS:
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
            for name in REPO_PATH.findall(line):
                if any(ch in name for ch in "*<>") or re.search(r"[A-Z]{3,}", name):
                    continue  # a pattern or a placeholder (RUN, NAME), not a path
                if not (REPO / name.rstrip("/")).exists():
                    problems.append(f"{path.relative_to(REPO)}:{number}: {name} does not exist")
    assert not problems, "\n".join(problems)


def runnable_blocks() -> list[tuple[str, list[str]]]:
    found = []
    for path in DOCS:
        for start, _, marked, body in code_blocks(path):
            if not marked:
                continue
            lines = [line for line in joined(body) if line.strip() and not line.lstrip().startswith("#")]
            transcript = [line.lstrip()[2:] for line in lines if line.lstrip().startswith("$ ")]
            found.append((f"{path.relative_to(REPO)}:{start}", transcript or lines))
    return found


def test_the_docs_mark_runnable_blocks() -> None:
    blocks = runnable_blocks()
    assert len(blocks) >= 3 and any("README.md" in where for where, _ in blocks)


@pytest.fixture(scope="session")
def docs_home(tmp_path_factory) -> Path:
    """One scratch directory (and $HYMO_HOME) for every runnable block: `hymo` and `.venv/bin/hymo` run this checkout."""
    home = tmp_path_factory.mktemp("docs-home")
    shim = home / ".venv" / "bin" / "hymo"
    shim.parent.mkdir(parents=True)
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m flows \"$@\"\n", encoding="utf-8")
    shim.chmod(shim.stat().st_mode | stat.S_IEXEC)
    return home


@pytest.mark.parametrize("where,commands", runnable_blocks(), ids=[where for where, _ in runnable_blocks()])
def test_runnable_block_runs_on_the_sample(where: str, commands: list[str], docs_home: Path) -> None:
    env = {**os.environ, "HYMO_HOME": str(docs_home), "PYTHONPATH": str(REPO), "PATH": f"{docs_home / '.venv' / 'bin'}:{os.environ['PATH']}",
           "COLUMNS": "100"}
    for command in commands:
        done = subprocess.run(["bash", "-c", command.split(" #")[0]], cwd=docs_home, env=env, capture_output=True, text=True, timeout=1800)
        assert done.returncode == 0, f"{where}: `{command}` exited {done.returncode}\n{(done.stdout + done.stderr)[-3000:]}"
