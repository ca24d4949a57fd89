"""What the quality statistics share: a lock-free cached property, and an n-gram measure's answer."""
from __future__ import annotations

from dataclasses import dataclass


class cached_property:  # noqa: N801 (used as functools.cached_property is)
    """functools.cached_property without its per-first-access lock (Python 3.11 takes an RLock each time): a
    document's view lives in one thread, and the quality stage makes ~7 first accesses a document."""

    def __init__(self, compute):
        self.compute, self.name, self.__doc__ = compute, compute.__name__, compute.__doc__

    def __set_name__(self, owner, name: str) -> None:
        self.name = name

    def __get__(self, instance, owner=None):
        if instance is None:
            return self
        value = instance.__dict__[self.name] = self.compute(instance)  # later reads find it in __dict__ first
        return value


@dataclass
class NgramRepetition:
    """For one n: coverage of the most frequent n-gram and of all repeated occurrences, in token characters."""

    top_fraction: float
    duplicate_fraction: float
