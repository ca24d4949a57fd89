"""Stale stages: a published stage whose inputs are no longer what its upstream stages hold.

Every stage records the digest of each upstream stage it read (`inputs: [{"stage_dir", "digest"}]`
in its manifest). After `hymo rerun RUN --stage quality --until dedup_fuzzy` with a changed threshold,
dedup_fuzzy's digest moves while decontam, split, ... still describe the old corpus: their recorded
digest no longer equals the upstream's current one. Comparing the two needs only the manifests (no
file is hashed), so `manifest show --verify`, `audit summary`, `hymo train` and the pretrain stage
all ask. A stage whose input is itself stale is stale too, and the command that refreshes both is
the rerun of the first stale stage of the chain, up to the shards (`--until shards`: it trains nothing).
Every command that reads a corpus calls `refuse_stale_corpus` before reading it (`hymo train`, the
pretrain stage, `python -m hymo_core.train` and torchrun, `hymo sweep`, `hymo ablate`, `hymo cpt`,
`hymo extend`).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from manifests.run_dir import completed_stages, parse_stage_dir


CORPUS_STAGE = "shards"  # the last data stage: what a refresh recomputes up to
TRAINING_STAGE = "pretrain"


@dataclass(frozen=True)
class Stale:
    stage: str  # the stage's name (`decontam`)
    directory: str  # its directory in the run (`09_decontam`)
    because: str  # which input moved, in words
    refresh_command: str  # `hymo rerun RUN --stage FIRST_STALE --until shards`: recomputes it and the data stages after it

    def line(self) -> str:
        trains = " (this trains a model)" if self.refresh_command.endswith(f"--stage {TRAINING_STAGE}") else ""
        return f"{self.directory} is stale: {self.because}; refresh with `{self.refresh_command}`{trains}"


class StaleStageError(ValueError):
    """A command would read a stage computed from inputs that have changed since."""


def stale_stages(run: Path) -> list[Stale]:
    """The run's published stages whose recorded input digests differ from their upstreams' current ones, in pipeline order."""
    run = Path(run)
    stages = completed_stages(run)
    current = {stage_dir.path.name: manifest.digest for stage_dir, manifest in stages}
    root_of: dict[str, tuple[tuple[int, str], str]] = {}  # stale directory -> (position, name) of the first stale stage of its chain
    found = []
    for stage_dir, manifest in stages:
        reasons: list[tuple[str, tuple[tuple[int, str], str]]] = []
        for entry in manifest.inputs:
            upstream = entry.get("stage_dir")
            if upstream is None:
                continue  # a source file of ingest: checked by ingest's own cache key
            if upstream in root_of:
                reasons.append((f"its input {upstream} is stale", root_of[upstream]))
            elif upstream not in current:
                read = parse_stage_dir(Path(upstream))
                if read is not None and read.position >= stage_dir.position:
                    continue  # another run's stage (`hymo retokenize` reads the base run's split and tokenizer): not this run's to check
                reasons.append((f"its input {upstream} is no longer published", (stage_dir.position, stage_dir.stage)))
            elif current[upstream] != entry.get("digest"):
                reasons.append((f"{upstream} changed after it ran (read {str(entry.get('digest'))[:12]}, now {current[upstream][:12]})",
                                (stage_dir.position, stage_dir.stage)))
        if reasons:
            root = min(root for _, root in reasons)
            root_of[stage_dir.path.name] = root
            found.append(Stale(stage_dir.stage, stage_dir.path.name, reasons[0][0], refresh_command(run, root[1], stages)))
    return found


def refresh_command(run: Path, first_stale: str, stages: list) -> str:
    """`hymo rerun RUN --stage FIRST_STALE --until shards`: recomputes the stale stages up to the corpus and trains
    nothing (a rerun without --until also runs pretrain: a training run started from a data command). Until the
    run's last data stage when it has no shards stage; a stale pretrain stage is refreshed by training, said so."""
    if first_stale == TRAINING_STAGE:
        return f"hymo rerun {run} --stage {TRAINING_STAGE}"
    data_stages = [stage_dir.stage for stage_dir, _ in stages if stage_dir.stage != TRAINING_STAGE]
    until = CORPUS_STAGE if CORPUS_STAGE in data_stages else data_stages[-1]
    return f"hymo rerun {run} --stage {first_stale} --until {until}"


def stale_before(run: Path, last_directory: str) -> list[Stale]:
    """The stale stages at or before `last_directory` in pipeline order (what a reader of that stage depends on)."""
    last = parse_stage_dir(Path(last_directory))
    if last is None:
        return stale_stages(run)
    return [s for s in stale_stages(run) if (found := parse_stage_dir(Path(s.directory))) is not None and found.position <= last.position]


def refuse_stale(run: Path, last_directory: str, what: str) -> None:
    """Raise StaleStageError, in one line naming the first stale stage and its refresh command, if `what` would read one."""
    stale = stale_before(run, last_directory)
    if stale:
        more = f" (and {len(stale) - 1} later stage{'s' if len(stale) > 2 else ''})" if len(stale) > 1 else ""
        raise StaleStageError(f"{what} refused: {stale[0].line()}{more}")


def refuse_stale_corpus(corpus: str | Path, what: str = "training") -> None:
    """`refuse_stale` for a corpus given as a run directory, its shards stage directory or a corpus.json in it."""
    path = Path(corpus)
    if path.is_file():
        path = path.parent
    if not path.is_dir():
        return  # not a local run: the reader says what is wrong with it
    if parse_stage_dir(path) is not None:
        refuse_stale(path.parent, path.name, what)
        return
    shards = [stage_dir.path.name for stage_dir, _ in completed_stages(path) if stage_dir.stage == "shards"]
    if shards:
        refuse_stale(path, shards[-1], what)
