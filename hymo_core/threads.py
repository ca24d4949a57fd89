"""One thread policy for every HyMo process that runs torch or numpy work: the trainer, its ranks, the
evaluation suite, the data stages' workers.

Why one: OpenMP threads that outnumber the cores a process really gets spin-wait on each other. On a
shared 2-core machine the sample trained at 25 tokens/s with 2 threads and at 197 with 1, and an
evaluation that chose its own count from `sched_getaffinity` ran 4-15x slower under load. So the count
is chosen once, in one place, from what the user asked and the CPUs this process may use, divided by
the ranks that share them, and the choice is recorded (`ThreadChoice.to_json`) wherever results are.

Precedence: an explicit request (`--threads N`) > `HYMO_THREADS` > `OMP_NUM_THREADS` > the CPUs this
process may use (affinity and the cgroup's CPU quota) divided by the number of ranks, at least 1.
"""
from __future__ import annotations

import contextlib
import math
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator, Mapping

ENV_VAR = "HYMO_THREADS"
# Variables a child process (a torchrun rank, a sandboxed program, a stage worker) inherits the choice by.
# HYMO_THREADS too: the child runs this policy again, and a HYMO_THREADS the parent's --threads overrode
# must not win there.
CHILD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", ENV_VAR)


@dataclass(frozen=True)
class ThreadChoice:
    threads: int  # intra-op threads for this process
    source: str  # what decided it: "--threads", "HYMO_THREADS", "OMP_NUM_THREADS" or "cpus/ranks"
    cpus: int  # CPUs this process may use
    ranks: int  # processes sharing those CPUs

    def to_json(self) -> dict[str, int | str]:
        return asdict(self)

    def describe(self) -> str:
        return f"{self.threads} thread{'s' if self.threads != 1 else ''} ({self.source}; {self.cpus} usable CPUs, {self.ranks} rank{'s' if self.ranks != 1 else ''})"


def _cgroup_cpu_quota(root: Path = Path("/sys/fs/cgroup")) -> int | None:
    """CPUs granted by a cgroup v2 `cpu.max` quota (a container limit affinity does not show), if any."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    if quota == "max":
        return None
    return max(1, math.floor(int(quota) / int(period)))


def usable_cpus() -> int:
    """The CPUs this process may run on: its affinity mask, capped by a cgroup CPU quota."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    quota = _cgroup_cpu_quota()
    return max(1, min(cpus, quota) if quota else cpus)


def _positive_int(text: str, name: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise ValueError(f"{name}={text!r}: expected a positive whole number of threads") from None
    if value < 1:
        raise ValueError(f"{name}={text!r}: expected a positive whole number of threads")
    return value


def choose_threads(requested: int | None = None, *, ranks: int = 1, environ: Mapping[str, str] | None = None) -> ThreadChoice:
    """The thread count for one process of `ranks` sharing this machine's usable CPUs (see the module docstring)."""
    environ = os.environ if environ is None else environ
    cpus, ranks = usable_cpus(), max(1, int(ranks))
    if requested is not None:
        return ThreadChoice(_positive_int(str(requested), "--threads"), "--threads", cpus, ranks)
    for name in (ENV_VAR, "OMP_NUM_THREADS"):
        if environ.get(name, "").strip():
            return ThreadChoice(_positive_int(environ[name].strip(), name), name, cpus, ranks)
    return ThreadChoice(max(1, cpus // ranks), "cpus/ranks", cpus, ranks)


def child_environment(choice: ThreadChoice) -> dict[str, str]:
    """Environment entries that give a child process the same count (set them before it imports torch)."""
    return {name: str(choice.threads) for name in CHILD_ENV_VARS}


def local_ranks(environ: Mapping[str, str] | None = None) -> int:
    """Processes of this job on this machine: torchrun's LOCAL_WORLD_SIZE in a rank, else 1."""
    environ = os.environ if environ is None else environ
    try:
        return max(1, int(environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def apply_threads(choice: ThreadChoice) -> ThreadChoice:
    """Use the choice in this process (torch's intra-op pool) and pass it on to the processes it starts."""
    os.environ.update(child_environment(choice))
    import torch

    if torch.get_num_threads() != choice.threads:
        torch.set_num_threads(choice.threads)
    return choice


@contextlib.contextmanager
def using_threads(choice: ThreadChoice) -> Iterator[ThreadChoice]:
    """`apply_threads` for the duration of a call (a training run inside a longer-lived process, a test),
    then torch's pool and the child variables as they were."""
    import torch

    saved_env = {name: os.environ.get(name) for name in CHILD_ENV_VARS}
    saved_threads = torch.get_num_threads()
    try:
        yield apply_threads(choice)
    finally:
        for name, value in saved_env.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
        if torch.get_num_threads() != saved_threads:
            torch.set_num_threads(saved_threads)
