"""The tree's layering, read from the source (ast), not from what happens to be imported at run time.

docs/architecture.md draws these rules; every package's `__init__` docstring states its own.
"""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("flows", "tasks", "hymo_core", "manifests")

# (importer prefix, imported prefix, why it is forbidden)
FORBIDDEN = (
    ("hymo_core", "flows", "the training core is usable without the pipeline"),
    ("hymo_core", "tasks", "the training core is usable without the pipeline"),
    ("hymo_core", "prefect", "the training core runs under torchrun without Prefect"),
    ("manifests", "tasks", "the data contract knows no stage"),
    ("manifests", "flows", "the data contract knows no flow"),
    ("manifests", "hymo_core", "the data contract knows no model"),
    ("tasks", "flows", "stages are pure functions the flows wire"),
    ("tasks.runner", "tasks.ingest", "the stage plumbing serves every stage and knows none"),
    ("tasks.runner", "tasks.filters", "the stage plumbing serves every stage and knows none"),
    ("tasks.runner", "tasks.dedup", "the stage plumbing serves every stage and knows none"),
    ("tasks.runner", "tasks.corpus", "the stage plumbing serves every stage and knows none"),
    ("tasks.runner", "tasks.pretrain", "the stage plumbing serves every stage and knows none"),
    ("hymo_core.kernels", "hymo_core.models", "kernels hold the math; the layers call them, never the reverse"),
    ("hymo_core.kernels", "hymo_core.train", "kernels hold the math only"),
    ("hymo_core.models.configs", "torch", "configs are read by every worker and the Prefect form: no torch import"),
    ("hymo_core.train.config", "torch", "configs are read by every worker and the Prefect form: no torch import"),
    ("hymo_core.train.optim_config", "torch", "configs are read by every worker and the Prefect form: no torch import"),
    ("hymo_core.planner", "torch", "the planner is arithmetic; `hymo plan` must not pay torch's import"),
)


def project_modules() -> dict[str, Path]:
    modules = {}
    for package in PACKAGES:
        for path in (REPO / package).rglob("*.py"):
            name = ".".join(path.relative_to(REPO).with_suffix("").parts)
            modules[name.removesuffix(".__init__")] = path
    return modules


MODULES = project_modules()


def imports_of(name: str) -> set[str]:
    """Every module `name` imports, anywhere in the file (inside functions too), resolved to full names."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def project_edges(name: str) -> set[str]:
    """The project modules `name` depends on (`from pkg import mod` counts as pkg.mod)."""
    edges = set()
    for imported in imports_of(name):
        while imported and imported not in MODULES:
            imported = imported.rpartition(".")[0]
        if imported and imported != name:
            edges.add(imported)
    return edges


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components with more than one module (Tarjan, iterative)."""
    index, low, on_stack, stack, found, counter = {}, {}, set(), [], [], [0]
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_no_import_cycle_among_project_modules():
    graph = {name: project_edges(name) for name in MODULES}
    assert cycles(graph) == []


def test_cycle_finder_finds_a_cycle():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def _under(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


@pytest.mark.parametrize("importer, imported, why", FORBIDDEN, ids=[f"{a}->{b}" for a, b, _ in FORBIDDEN])
def test_layering(importer, imported, why):
    offenders = sorted(f"{name} imports {target}" for name in MODULES if _under(name, importer)
                       for target in imports_of(name) if _under(target, imported))
    assert not offenders, f"{why}: {offenders}"


def test_every_package_says_what_it_holds():
    """Each package's __init__ is a docstring saying what it holds and what it may import."""
    for name, path in MODULES.items():
        if path.name != "__init__.py":
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        doc = ast.get_docstring(tree)
        assert doc and "May import" in doc, f"{path.relative_to(REPO)}: no docstring saying what it may import"
