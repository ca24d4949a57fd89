"""A fault injected on purpose: the model's final norm output turns NaN on its Nth training forward (the head is fused
into the loss and reads `output.weight` only, so the last module a training forward calls is the final norm).

`poison(build, at)` wraps `hymo_core.train.run.build_parallel_model` in this process (monkeypatch it in);
`nan_site(directory, at)` writes a sitecustomize.py that does the same in every Python process started with
`directory` first on PYTHONPATH (torchrun's ranks, a `hymo train` subprocess), so each entry point's exit
status after a NaN stop is checked on a real process.
"""
from __future__ import annotations

from pathlib import Path
from typing import Callable


def poison(build: Callable, at: int) -> Callable:
    def poisoned(*args, **kwargs):
        model = build(*args, **kwargs)
        calls = [0]

        def hook(module, inputs, output):
            if not module.training:
                return output
            calls[0] += 1
            return output * float("nan") if calls[0] == at else output

        model.norm.register_forward_hook(hook)
        return model

    return poisoned


SITE = '''
import importlib.abc, importlib.util, sys

class _Poison(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        if name != "hymo_core.train.run":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        run_module = spec.loader.exec_module

        def exec_module(module):
            run_module(module)
            sys.path.insert(0, {tests!r})
            from nan_fault import poison
            module.build_parallel_model = poison(module.build_parallel_model, {at})

        spec.loader.exec_module = exec_module
        return spec

sys.meta_path.insert(0, _Poison())
'''


def nan_site(directory: Path, at: int) -> Path:
    """A directory holding sitecustomize.py that poisons the head's `at`-th training forward of any training run."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "sitecustomize.py").write_text(SITE.format(tests=str(Path(__file__).parent), at=at), encoding="utf-8")
    return directory
