"""`python -m flows`: the `hymo` command line, ended without the interpreter's teardown once it has returned.

A `hymo run` has imported Prefect, pyarrow, pandas, matplotlib, the tokenizer and every stage module by its end;
freeing them one by one took the process 1-2 s after its last line was printed (issue 57). `end_now` is
registered before anything else, so it is the last atexit call: the threads were joined and every other exit
handler ran (logging flushed, multiprocessing and Prefect shut down) before it ends the process with the
command's code. A command that raises, or exits through SystemExit (argparse, --help), is torn down as usual.
"""
import atexit
import os
import sys

RETURNED: list[int] = []


def end_now() -> None:
    if RETURNED:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(RETURNED[0])


if __name__ == "__main__":
    atexit.register(end_now)  # first registered, last run
    from flows.cli import main

    RETURNED.append(main())
    sys.exit(RETURNED[0])
