"""Shared fixtures: small real inputs on disk and one Prefect test server per session."""
from __future__ import annotations

import os
import textwrap
from pathlib import Path

import pytest

os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
os.environ.setdefault("HYMO_PROGRESS", "0")

REPO = Path(__file__).resolve().parent.parent
SAMPLE = REPO / "manifests" / "sample"


def write_spec(directory: Path, name: str, kind: str, path: str, **extra: str) -> Path:
    """A source-spec TOML in `directory` pointing at `path` (relative to the spec)."""
    lines = [
        f'name = "{name}"', f'kind = "{kind}"', f'path = "{path}"', 'origin = "test fixture"',
        'snapshot = "2026-11-29"', 'license = "CC0-1.0"',
    ]
    lines += [f"{key} = {value!r}".replace("'", '"') for key, value in extra.items()]
    spec = directory / f"{name}.toml"
    spec.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return spec


def page(title: str, body: str, nav: str = "Home | Docs | Blog | Contact | Login") -> str:
    """A real-looking HTML page: navigation, a main article, a footer."""
    return textwrap.dedent(f"""\
        <!DOCTYPE html><html><head><title>{title}</title></head><body>
        <nav><ul>{''.join(f'<li><a href="/{w.strip().lower()}">{w.strip()}</a></li>' for w in nav.split('|'))}</ul></nav>
        <main><article><h1>{title}</h1>{''.join(f'<p>{p}</p>' for p in body.split(chr(10)) if p.strip())}</article></main>
        <footer><p>Copyright 2026 Example Corp. All rights reserved. Privacy policy.</p></footer>
        </body></html>""")


PROSE = [
    "The river ran quietly past the old mill, where the miller's daughter had spent every summer of her childhood watching the water wheel turn.",
    "She remembered the smell of flour and the sound of the stones grinding grain into the soft white powder that the whole village depended on.",
    "When the mill finally closed, the villagers gathered on the bridge to watch the last sacks of flour being loaded onto a cart bound for the city.",
]


@pytest.fixture
def html_dir(tmp_path: Path) -> Path:
    root = tmp_path / "pages"
    root.mkdir()
    for i in range(6):
        (root / f"page{i}.html").write_text(page(f"Story {i}", "\n".join(PROSE[j % 3] + f" Chapter {i}." for j in range(i, i + 3))), encoding="utf-8")
    return root


@pytest.fixture(scope="session")
def prefect_harness():
    """One real (SQLite) Prefect server for every flow-level test of the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield
