"""A Prefect task that imports Prefect only when the flow first uses it.

Importing Prefect costs ~5 s of CPU. Shard worker processes are spawned and
import the stage module (to unpickle its config and shard function); with a
module-level `@task` every worker of every stage would pay that import. A stage
module declares `name_task = lazy_task(run_name, name="...")` instead: the flow
process builds the real task on first use, workers never import Prefect.
"""
from __future__ import annotations

from typing import Any, Callable


class lazy_task:
    def __init__(self, fn: Callable[..., Any], **task_options: Any):
        self.fn = fn
        self.task_options = task_options
        self._task: Any = None
        self.__name__ = task_options.get("name", fn.__name__)
        self.__doc__ = fn.__doc__

    @property
    def task(self) -> Any:
        if self._task is None:
            from prefect import task

            self._task = task(**self.task_options)(self.fn)
        return self._task

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.task(*args, **kwargs)

    def __getattr__(self, attribute: str) -> Any:  # .submit, .map, .with_options, ...
        return getattr(self.task, attribute)
