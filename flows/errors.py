"""Errors for people: a failed command ends in one line naming the stage, the file and the fix.

Prefect logs every failed task with its traceback on the console, and Python
prints another at exit: two hundred lines for a truncated input file. Unless
`--debug` is given, the console shows Prefect's log lines without tracebacks
(the Prefect API and UI still receive them in full) and the command ends with
`explain(exc)`: `hymo: stage ingest failed: FILE: what is wrong — fix: what to do`.
"""
from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from types import TracebackType

from manifests.run_dir import parse_stage_dir
from manifests.run_layout import StageListChanged

DEBUG_HINT = "--debug shows the traceback"


def stage_of(exc: BaseException) -> str | None:
    """The pipeline stage the exception passed through, read off its traceback (None outside a stage)."""
    from flows.stages import STAGE_NAMES

    found = None
    tb: TracebackType | None = exc.__traceback__
    while tb is not None:
        frame = tb.tb_frame
        entry = frame.f_locals.get("entry")
        name = getattr(entry, "name", None) or (frame.f_locals.get("name") if frame.f_code.co_filename.endswith(os.path.join("flows", "pipeline.py")) else None)
        module = Path(frame.f_code.co_filename).stem
        if isinstance(name, str) and name in STAGE_NAMES:
            found = name
        elif found is None and module in STAGE_NAMES:
            found = module
        tb = tb.tb_next
    return found


def fix_for(exc: BaseException) -> str:
    """What the user should do about `exc`, in a few words."""
    from manifests.run_lock import RunLocked
    from manifests.stage_manifest import DigestMismatch, StageNotComplete
    from manifests.staleness import StaleStageError
    from tasks.ingest.ingest import BadInputFiles, InputFileError

    if isinstance(exc, RunLocked):
        return "wait for the other run, stop it, or choose another --out"
    if isinstance(exc, StageListChanged):
        return "`hymo run --change-stages` to replace the directory's pipeline, or another --out"
    if isinstance(exc, BadInputFiles):
        return ('repair or remove the files named (or fix their source spec), or set [ingest] on_bad_file = "quarantine" to leave each '
                "out with an audit row; then run the same command again")
    if isinstance(exc, InputFileError):
        return "repair or remove that input file (or fix its source spec), then run the same command again"
    if isinstance(exc, DigestMismatch):
        stage_dir = parse_stage_dir(exc.stage_dir) if exc.stage_dir else None
        if stage_dir is None:
            return "a published file changed after its stage wrote it; rerun that stage with `hymo rerun` and --force to recompute it"
        return f"a published file changed after the stage wrote it; `hymo rerun {stage_dir.path.parent} --stage {stage_dir.stage} --force` recomputes it"
    if isinstance(exc, StageNotComplete):
        return "run the earlier stages first (`hymo run --out RUN`), or pass the right run directory"
    if isinstance(exc, StaleStageError):
        return "run the refresh command named above (it recomputes the corpus and trains nothing), then this command again"
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return "free disk space where the run directory lives (nothing partial was published), then run the same command again"
    if isinstance(exc, OSError) and exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return "make that path writable (or choose another --out), then run the same command again"
    if isinstance(exc, FileNotFoundError):
        return "check the path (a relative path is read from the current directory)"
    if type(exc).__name__ == "ValidationError" or isinstance(exc, (ValueError, KeyError, TypeError)) and "config" in str(exc).lower():
        return "fix the configuration value named above"
    return f"see the message above; {DEBUG_HINT}"


# Errors that say what the user must change; retrying the stage would only fail again, later.
NEEDS_A_PERSON_ERRNOS = {errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOSPC, errno.EDQUOT,
                         errno.ENAMETOOLONG, errno.ELOOP}
PASSING_FAULTS = {"BrokenProcessPool", "KilledWorker", "CommClosedError"}  # a worker died, a connection dropped


def may_pass_on_retry(exc: BaseException) -> bool:
    """Whether running the same stage again may succeed: a worker that died, an I/O or network error; not a
    user's mistake (bad input, config, permissions, a full disk), not a bug's (wrong counts, a changed file)."""
    if any(cls.__name__ in PASSING_FAULTS for cls in type(exc).__mro__) or isinstance(exc, TimeoutError):
        return True
    if isinstance(exc, (FileNotFoundError, FileExistsError, PermissionError, NotADirectoryError, IsADirectoryError)):
        return False  # also when raised with a message only (no errno), e.g. a benchmark file that is not there
    return isinstance(exc, OSError) and exc.errno is not None and exc.errno not in NEEDS_A_PERSON_ERRNOS


MESSAGE_CHARS = 400  # a library's message (an Arrow schema, a server's reply) beyond this is cut, visibly


def shortened(message: str) -> str:
    """`message`, or its first MESSAGE_CHARS characters up to a word and how much was left out: never cut silently."""
    if len(message) <= MESSAGE_CHARS:
        return message
    kept = message[:MESSAGE_CHARS].rsplit(" ", 1)[0]
    return f"{kept} … ({len(message) - len(kept)} more characters; {DEBUG_HINT})"


def explain(exc: BaseException) -> str:
    """One line: `hymo: [stage S failed: ][FILE: ]message — fix: ...`."""
    from tasks.ingest.source_fs import InputFileError

    stage = stage_of(exc)
    message = " ".join(str(exc).split()) or type(exc).__name__
    filename = getattr(exc, "filename", None)
    if filename and str(filename) not in message:
        message = f"{filename}: {message}"
    if isinstance(exc, OSError) and exc.errno is not None and not isinstance(exc, FileNotFoundError) and os.strerror(exc.errno) not in message:
        message = f"{message} ({os.strerror(exc.errno)})"
    where = f"stage {stage} failed: " if stage else ""
    if not isinstance(exc, (StageListChanged, InputFileError)):  # those bound their own length (two stage lists; five files)
        message = shortened(message)
    fix = fix_for(exc)
    if DEBUG_HINT not in fix:
        fix = f"{fix} ({DEBUG_HINT})"
    return f"hymo: {where}{type(exc).__name__}: {message} — fix: {fix}"


# Commands whose refusals (a bad recipe, corpus or checkpoint) exit 2, as `python -m hymo_core.train` does.
TRAINING_COMMANDS = {"train"}


def failure_line_and_code(exc: BaseException, command: str | None = None) -> tuple[str, int]:
    """The last line a failed command prints, and its exit status (hymo_core.exit_codes' table): an alert's stop
    is 3 and names the run's summary.json; a refusal of the inputs 2; anything else 1 (a crash)."""
    from hymo_core.exit_codes import CRASHED, REFUSED, STOPPED, stop_line, stopped_by_alert

    stop = stopped_by_alert(exc)
    if stop is not None:  # a TrainingStopped knows its summary; a torchrun launch's message is its rank's stop line
        return (stop_line(stop, stop.summary_path) if hasattr(stop, "summary_path") else str(stop)), STOPPED
    return explain(exc), REFUSED if is_refusal(exc, command) else CRASHED


def is_refusal(exc: BaseException, command: str | None) -> bool:
    """Inputs refused before any work: another tokenizer, a held lock, --resume with nothing to resume; for
    training commands also a recipe, corpus or checkpoint that does not fit (ValueError) or a used --out."""
    from manifests.run_lock import RunLocked

    # By name: importing their modules would import torch into commands that never trained.
    if isinstance(exc, RunLocked) or type(exc).__name__ in ("TokenizerMismatch", "ResumeRefused"):
        return True
    return command in TRAINING_COMMANDS and isinstance(exc, (ValueError, FileExistsError))


def quiet_console_tracebacks() -> None:
    """Prefect's console log lines keep coming, without tracebacks; its API handler still sends them in full.

    Prefect re-creates its handlers whenever it sets logging up again (a flow
    run, a settings change), so the console handler class itself is adjusted,
    in this process only (the CLI without `--debug`).
    """
    from prefect.logging.handlers import PrefectConsoleHandler

    if getattr(PrefectConsoleHandler, "_hymo_quiet", False):
        return
    full_format = PrefectConsoleHandler.format

    def format_without_traceback(self: logging.Handler, record: logging.LogRecord) -> str:
        saved = record.exc_info, record.exc_text, record.stack_info
        record.exc_info = record.exc_text = record.stack_info = None  # restored: other handlers see the record whole
        try:
            return full_format(self, record).split("\nTraceback (most recent call last):")[0]
        finally:
            record.exc_info, record.exc_text, record.stack_info = saved

    PrefectConsoleHandler.format = format_without_traceback
    PrefectConsoleHandler._hymo_quiet = True
