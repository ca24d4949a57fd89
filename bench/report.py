"""Write one benchmark's table into its own section of docs/benchmarks.md, replacing the old one."""
from __future__ import annotations

import datetime
import os
import platform
import re
import subprocess
from pathlib import Path

DOC = Path(__file__).resolve().parent.parent / "docs" / "benchmarks.md"
HEADER = "# Benchmarks\n\nMeasured with the scripts in `bench/`; each section names its script, date and machine.\n"


def run_stamp() -> str:
    """Date, machine, load and commit of this run, as the figures beside it were measured."""
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=DOC.parent, capture_output=True,
                                text=True, timeout=10).stdout.strip() or "unknown"
    except OSError:
        commit = "unknown"
    load = ", ".join(f"{value:.1f}" for value in os.getloadavg())
    return (f"Measured {datetime.date.today().isoformat()} on commit {commit}, {platform.machine()} "
            f"with {os.cpu_count()} CPUs, load average {load} (1/5/15 min) as it finished.")


QUIET_LOAD = 1.5  # docs/ figures only from a machine this idle (1-minute load average before the run)


def refuse_if_loaded(load_before: float) -> bool:
    """True (and says so on stderr) when a run that started at this 1-minute load must not write docs/ figures."""
    if load_before < QUIET_LOAD:
        return False
    import sys

    print(f"not written: the 1-minute load was {load_before:.2f} at start (>= {QUIET_LOAD}); rerun on a quiet machine", file=sys.stderr)
    return True


def write_section(title: str, table: str, note: str = "") -> None:
    """This benchmark's `## title` section of docs/benchmarks.md, stamped with the run's date, machine and load."""
    replace_section(DOC, f"## {title}", f"## {title}\n\n{run_stamp()} {note}\n\n{table}\n")


def markdown_table(header: list[str], rows: list[tuple]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return "\n".join(lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows])


def replace_section(path: Path, heading: str, body: str) -> None:
    """Replace (or append) one `## ` section of a Markdown file, leaving the others untouched."""
    existing = path.read_text(encoding="utf-8") if path.exists() else HEADER
    found = re.search(rf"^{re.escape(heading)}$", existing, re.M)
    start = found.start() if found else -1
    if start == -1:
        updated = existing.rstrip("\n") + "\n\n" + body.rstrip("\n") + "\n"
    else:
        end = existing.find("\n## ", start + len(heading))
        updated = existing[:start] + body.rstrip("\n") + "\n" + (existing[end:] if end != -1 else "")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(updated, encoding="utf-8")


def publish(lines: list[str], heading: str, write_to: str | None) -> int:
    """The end of a bench main() whose section starts with `heading`: print it, and with --write replace it in that file."""
    text = "\n".join(lines)
    print(text)
    if write_to:
        replace_section(Path(write_to), heading, text)
    return 0


def write_section_with_picture(title: str, table: str, note: str, picture: Path, alt: str) -> None:
    """write_section, with `picture` copied into docs/ under its own name and shown below the table."""
    import shutil

    shutil.copyfile(picture, DOC.parent / picture.name)
    write_section(title, f"{table}\n\n![{alt}]({picture.name})", note)
