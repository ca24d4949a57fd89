"""Functions the watchdog tests run in child processes: a module of their own, so a child imports
only this file (not the test module, pytest and the whole stage stack)."""
import os
import time


def sleepy(item: int) -> int:
    if item == 2:
        time.sleep(60)
    if item == 4:
        raise ValueError("bad item")
    return item * 10


def pid_of(item: int) -> int:
    if item == 2:
        time.sleep(60)
    return os.getpid()
