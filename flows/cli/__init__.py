"""The `hymo` command line: one module per command group, each with `add_commands(subparsers)`.

Checks that need no server (flows.preflight) run before a command imports Prefect or torch, so a
mistake costs seconds and writes nothing.

May import: `flows` modules, `manifests`, `tasks`, `hymo_core`; nothing but `flows.__main__` and the
console script imports it.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any, Callable

from flows.prefect_env import apply_prefect_defaults


def _command_groups() -> list[Callable[[Any], None]]:
    from flows import serve
    from flows.cli import ablate, audit, classifier, cpt, extend, interop, manifest, pipeline, plan, sweep, trace, train

    return [pipeline.add_commands, audit.add_commands, manifest.add_commands, trace.add_commands, train.add_commands,
            serve.add_commands, classifier.add_commands, cpt.add_commands, interop.add_commands, sweep.add_commands,
            extend.add_commands, ablate.add_commands, plan.add_commands]


def version_line() -> str:
    """`hymo --version`: the installed package's version, and the Python it runs on (no torch or Prefect import)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    try:
        installed = version("hymo")
    except PackageNotFoundError:
        installed = "unknown (not installed; run from a source tree)"
    return f"hymo {installed} (Python {platform.python_version()})"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hymo", description="HyMo: raw web pages to a pretraining corpus and a trained checkpoint.")
    parser.add_argument("--version", action="version", version=version_line(), help="print HyMo's version and exit")
    sub = parser.add_subparsers(dest="command", required=True)
    for add_commands in _command_groups():
        add_commands(sub)
    describe_subcommands(parser)
    return parser


def subcommands(parser: argparse.ArgumentParser) -> list[tuple[str, str | None, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each direct subcommand."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            found += [(name, helps.get(name), child) for name, child in action.choices.items()]
    return found


def describe_subcommands(parser: argparse.ArgumentParser) -> None:
    """`hymo CMD --help` opens with the line `hymo --help` lists for CMD, unless CMD has a description of its own."""
    for _, line, child in subcommands(parser):
        if line and not child.description:
            child.description = line
        describe_subcommands(child)


def main(argv: list[str] | None = None) -> int:
    apply_prefect_defaults()
    parser = build_parser()
    parser.add_argument("--debug", action="store_true", help="show tracebacks (default: one line naming the stage, file and fix)")
    argv = sys.argv[1:] if argv is None else list(argv)
    debug = "--debug" in argv  # accepted anywhere on the line, also after the sub-command
    args = parser.parse_args([a for a in argv if a != "--debug"])
    from flows.preflight import PreflightError, preflight
    from manifests.run_lock import release_held_locks

    try:
        try:
            preflight(args)  # before Prefect (and torch) is imported: a bad config, path or lock fails here, writing nothing
        except PreflightError as exc:
            print(exc.line(), file=sys.stderr)
            return 2
        return run_command(args, debug)
    finally:
        release_held_locks()  # the run directory's lock, taken by the pre-flight for the whole command


def run_command(args: argparse.Namespace, debug: bool) -> int:
    """The parsed, pre-flight-checked command; every failure ends in one line unless `debug`."""
    from flows.console import route_prefect_logs

    route_prefect_logs()  # Prefect's log lines above the live progress bar, not over it
    if debug:
        return args.func(args)
    from flows.errors import failure_line_and_code, quiet_console_tracebacks

    quiet_console_tracebacks()
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print("hymo: interrupted; published stages stay, a re-run continues from them", file=sys.stderr)
        return 130
    except Exception as exc:  # every failure a user can meet ends in one line; --debug shows the traceback
        line, code = failure_line_and_code(exc, args.command)
        print(line, file=sys.stderr)
        return code


if __name__ == "__main__":
    sys.exit(main())
