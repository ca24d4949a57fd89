"""The command line a newcomer meets: a version, help on every subcommand and option, distinct `cpt run` and
`cpt verify`, and `--set section.key=value` overrides on run, train and serve (applied, typed as TOML)."""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import build_parser, subcommands

REPO = Path(__file__).resolve().parents[2]


def walk(parser: argparse.ArgumentParser, path: tuple[str, ...] = ("hymo",)):
    yield path, parser
    for name, _, child in subcommands(parser):
        yield from walk(child, path + (name,))


def test_every_subcommand_has_a_one_line_description_and_every_option_a_help() -> None:
    missing = []
    for path, parser in walk(build_parser()):
        for name, line, _ in subcommands(parser):
            if not line or "\n" in line:
                missing.append(" ".join(path + (name,)) + ": no one-line description")
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._SubParsersAction)):
                continue
            if not action.help:
                missing.append(f"{' '.join(path)} {'/'.join(action.option_strings) or action.dest}: no help")
    assert not missing, "\n".join(missing)
    run = dict((name, child) for name, _, child in subcommands(build_parser()))["run"]
    assert "\nrun the whole pipeline" in run.format_help()  # `hymo run --help` says what it does, not only its usage


def test_version() -> None:
    done = subprocess.run([sys.executable, "-m", "flows", "--version"], cwd=REPO, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert done.returncode == 0 and done.stdout.startswith("hymo 0.") and "Python 3." in done.stdout


def test_cpt_run_and_cpt_verify_are_distinct_subcommands() -> None:
    from flows.cli.cpt import cmd_cpt, cmd_cpt_verify

    parser = build_parser()
    verify = parser.parse_args(["cpt", "verify", "runs/cpt"])
    assert verify.func is cmd_cpt_verify and verify.run == "runs/cpt"
    run = parser.parse_args(["cpt", "run", "base.pt", "--domain", "d", "--general", "g", "--out", "o"])
    assert run.func is cmd_cpt and run.base == "base.pt"
    with pytest.raises(SystemExit):  # the old shared positional (`hymo cpt CKPT ...`) is gone
        parser.parse_args(["cpt", "base.pt", "--domain", "d", "--general", "g", "--out", "o"])
    with pytest.raises(SystemExit):  # `run` needs its corpora and output
        parser.parse_args(["cpt", "run", "base.pt"])


def test_set_overrides_reach_run_train_and_serve(tmp_path: Path) -> None:
    from flows.config import load_config
    from flows.serve import pipeline_defaults
    from hymo_core.train.recipe import load_run_config

    sets = ["pretrain.train.max_steps=50", "run.workers=2", "langid.langs=[\"en\"]", "tokenizer.vocab_size=512"]
    parser = build_parser()
    for command in (["run"], ["serve"]):
        args = parser.parse_args(command + [f"--set={s}" for s in sets])
        assert args.set == sets
    config = load_config(None, sets)
    assert config.pretrain.train.max_steps == 50 and config.workers == 2 and config.tokenizer.vocab_size == 512
    assert list(config.langid.langs) == ["en"]
    assert load_config(None).pretrain.train.max_steps != 50  # the file itself is untouched
    form = pipeline_defaults(tmp_path, None, sets)["config"]
    assert form["pretrain"]["train"]["max_steps"] == 50 and form["workers"] == 2
    args = parser.parse_args(["train", "--corpus", "c", "--out", "o", "--set", "train.max_steps=90", "--set", "train.peak_lr=0.001"])
    train, _ = load_run_config(args.config, args.set)
    assert train.max_steps == 90 and train.peak_lr == 0.001
