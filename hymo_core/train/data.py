"""Token loader: (x, y) windows from the shards a corpus manifest lists, resumable from a checkpoint.

API (the trainer's only door to the data):

    corpus = CorpusReader("RUN/NN_shards")          # or the corpus.json path, or the run dir
    loader = TokenLoader(corpus, split="train", seq_len=T, batch_size=B, seed=0)   # rank=, world_size= for DDP
    x_BT, y_BT = loader.next_batch()                 # int64 tensors, y = x shifted by one token
    state = loader.state_dict()                      # {"manifest_digest", "epoch", "position", "shard", "offset", ...}
    loader.load_state_dict(state)                    # refuses another corpus, seq_len or seed
    # at the end of an epoch next_batch raises EndOfEpoch; the trainer decides:
    loader.start_next_epoch()                        # a new seeded order over the same windows
    for x_BT, y_BT in ValidationLoader(corpus, seq_len=T, batch_size=B, max_batches=N): ...

Windows: each shard of n tokens is cut into (n - 1) // T windows starting at
multiples of T, each reading T + 1 tokens (x = first T, y = last T), so every
token but a shard's first is a target once per epoch. Windows may cross an EOS
(seed 001, Lab 2: documents attend to the previous one; no block mask).
Order: a permutation of all windows of the split, drawn from a private
numpy Generator seeded with (seed, epoch) — the global RNGs are never touched,
so resuming needs only (epoch, position). Shards are memory-mapped and their
sha256 checked once when the reader opens them; a mismatch names the file.

This module imports only numpy, torch, json and hashlib: the training core does
not depend on the pipeline that produced the shards.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from hymo_core.train.window_order import window_permutation, window_table

CORPUS_FILE = "corpus.json"
HASH_CHUNK = 1 << 20


class CorpusError(ValueError):
    """The corpus manifest or one of its shards is not what was recorded."""


class EndOfEpoch(Exception):
    """No full batch is left in this epoch; call `start_next_epoch()` to go on (never done silently)."""


def _canonical_digest(payload: dict[str, Any]) -> str:
    # Same canonical form as manifests.digest.canonical_json (sorted keys, compact, UTF-8).
    body = {k: v for k, v in payload.items() if k != "digest"}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def _sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _resolve(path: Path) -> Path:
    """corpus.json, the directory holding it, or a run directory with one `NN_shards/corpus.json`."""
    path = Path(path)
    if path.is_file():
        return path
    if (path / CORPUS_FILE).is_file():
        return path / CORPUS_FILE
    found = sorted(path.glob(f"[0-9][0-9]_shards/{CORPUS_FILE}")) if path.is_dir() else []
    if len(found) == 1:
        return found[0]
    raise CorpusError(f"{path}: no {CORPUS_FILE} (give the file, the shards stage directory or the run directory)")


class CorpusReader:
    """A corpus manifest with its shards opened by memory map, digests verified once."""

    def __init__(self, path: str | Path, verify: bool = True):
        self.path = _resolve(Path(path))
        self.root = self.path.parent
        try:
            self.manifest = json.loads(self.path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise CorpusError(f"{self.path}: unreadable corpus manifest ({exc})") from exc
        recorded = self.manifest.get("digest")
        if recorded != _canonical_digest(self.manifest):
            raise CorpusError(f"{self.path}: manifest digest {str(recorded)[:12]}… does not match its content")
        self.digest: str = recorded
        self.dtype = np.dtype(self.manifest["dtype"]).newbyteorder("<")
        self.vocab_size: int = self.manifest["tokenizer"]["vocab_size"]
        self.eos_id: int = self.manifest["eos_id"]
        self.verify = verify
        self._opened: dict[tuple[str, int], np.memmap] = {}

    def shard_entries(self, split: str) -> list[dict[str, Any]]:
        if split not in self.manifest["shards"]:
            raise CorpusError(f"{self.path}: no split {split!r} (have {sorted(self.manifest['shards'])})")
        return self.manifest["shards"][split]

    def shard(self, split: str, index: int) -> np.memmap:
        key = (split, index)
        if key not in self._opened:
            entry = self.shard_entries(split)[index]
            shard_path = self.root / entry["path"]
            if not shard_path.is_file():
                raise CorpusError(f"{shard_path}: listed in {self.path} but missing")
            if self.verify:
                actual = _sha256_file(shard_path)
                if actual != entry["sha256"]:
                    raise CorpusError(f"{shard_path}: sha256 {actual[:12]}… but the corpus manifest recorded {entry['sha256'][:12]}…")
            tokens = np.memmap(shard_path, dtype=self.dtype, mode="r")
            if len(tokens) != entry["tokens"]:
                raise CorpusError(f"{shard_path}: {len(tokens)} tokens but the corpus manifest recorded {entry['tokens']}")
            self._opened[key] = tokens
        return self._opened[key]

    def open_all(self, split: str) -> list[np.memmap]:
        return [self.shard(split, i) for i in range(len(self.shard_entries(split)))]


def _window_table(corpus: CorpusReader, split: str, seq_len: int) -> tuple[list[np.memmap], np.ndarray]:
    """(shard index, start offset) of every window of T + 1 tokens in the split, in shard order."""
    shards = corpus.open_all(split)
    return shards, window_table([len(tokens) for tokens in shards], seq_len)


def _gather(shards: list[np.memmap], windows: np.ndarray, seq_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    block_BT1 = np.stack([np.asarray(shards[s][o:o + seq_len + 1], dtype=np.int64) for s, o in windows])
    block = torch.from_numpy(block_BT1)
    return block[:, :-1].contiguous(), block[:, 1:].contiguous()


class TokenLoader:
    """Shuffled training windows with a cursor that round-trips through a checkpoint."""

    def __init__(self, corpus: CorpusReader, split: str = "train", seq_len: int = 1024, batch_size: int = 8, seed: int = 0,
                 rank: int = 0, world_size: int = 1):
        if seq_len < 1 or batch_size < 1:
            raise ValueError(f"seq_len and batch_size must be >= 1, got {seq_len}, {batch_size}")
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in [0, world_size={world_size})")
        self.corpus, self.split, self.seq_len, self.batch_size, self.seed = corpus, split, seq_len, batch_size, seed
        # Data parallel: every rank draws the same permutation; each global step consumes
        # batch_size * world_size windows and rank r takes the r-th slice of them.
        self.rank, self.world_size = rank, world_size
        self.step_windows = batch_size * world_size
        self.shards, self.windows = _window_table(corpus, split, seq_len)
        if len(self.windows) < self.step_windows:
            raise CorpusError(f"{corpus.path}: {split} has {len(self.windows)} windows of {seq_len + 1} tokens, fewer than one step of {self.step_windows}")
        self.epoch, self.position = 0, 0
        self._order = self._permutation(0)

    def _permutation(self, epoch: int) -> np.ndarray:
        return window_permutation(self.seed, epoch, len(self.windows))  # the order `hymo trace --step` recomputes

    @property
    def batches_per_epoch(self) -> int:
        return len(self.windows) // self.step_windows

    def next_batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        if self.position + self.step_windows > len(self._order):
            raise EndOfEpoch(f"epoch {self.epoch} of {self.split} done after {self.position} windows ({len(self._order) - self.position} left over)")
        mine = self.position + self.rank * self.batch_size
        picked = self.windows[self._order[mine:mine + self.batch_size]]
        self.position += self.step_windows
        return _gather(self.shards, picked, self.seq_len)

    def reserve_update(self, windows: int) -> None:
        """Before an update of `windows` global windows: start the next epoch now if fewer are left.

        Epochs then turn between updates, never between the micro-batches of one, so the
        windows an update reads do not depend on how it is split over ranks and micro-batches.
        """
        if windows > len(self._order):
            raise CorpusError(f"{self.corpus.path}: {self.split} has {len(self._order)} windows of {self.seq_len + 1} tokens, "
                              f"fewer than one update of {windows}")
        if self.position + windows > len(self._order):
            self.start_next_epoch()

    def start_next_epoch(self) -> None:
        self.epoch += 1
        self.position = 0
        self._order = self._permutation(self.epoch)

    def _next_window(self) -> tuple[int, int]:
        if self.position >= len(self._order):
            return -1, -1
        shard, offset = self.windows[self._order[self.position]]
        return int(shard), int(offset)

    def state_dict(self) -> dict[str, Any]:
        shard, offset = self._next_window()
        return {"manifest_digest": self.corpus.digest, "split": self.split, "seq_len": self.seq_len, "batch_size": self.batch_size,
                "world_size": self.world_size, "seed": self.seed, "epoch": self.epoch, "position": self.position, "shard": shard, "offset": offset}

    def load_state_dict(self, state: dict[str, Any], reshard: bool = False) -> None:
        """`reshard=True` accepts a cursor saved at another world size: positions count global windows."""
        keys = ("manifest_digest", "split", "seq_len", "seed") + (() if reshard else ("world_size",))
        for key in keys:
            mine = self.corpus.digest if key == "manifest_digest" else getattr(self, key)
            if state.get(key) != mine:
                raise CorpusError(f"loader state was saved with {key}={state.get(key)!r}, this loader has {mine!r}; refusing to resume")
        self.epoch = int(state["epoch"])
        self._order = self._permutation(self.epoch)
        self.position = int(state["position"])
        if (state["shard"], state["offset"]) != self._next_window():
            raise CorpusError(f"loader state points at shard {state['shard']} offset {state['offset']} but position {self.position} is {self._next_window()}")


class ValidationLoader:
    """The first `max_batches` batches of consecutive validation windows; every iteration starts at offset 0."""

    def __init__(self, corpus: CorpusReader, seq_len: int = 1024, batch_size: int = 8, max_batches: int | None = None, split: str = "validation"):
        self.seq_len, self.batch_size, self.max_batches = seq_len, batch_size, max_batches
        self.shards, self.windows = _window_table(corpus, split, seq_len)

    def __len__(self) -> int:
        full = len(self.windows) // self.batch_size
        return full if self.max_batches is None else min(full, self.max_batches)

    def batch(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Batch `index` of the prefix (ranks split the batches between them)."""
        if not 0 <= index < len(self):
            raise IndexError(f"validation batch {index} is outside the {len(self)} batches")
        return _gather(self.shards, self.windows[index * self.batch_size:(index + 1) * self.batch_size], self.seq_len)

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for b in range(len(self)):
            yield self.batch(b)
