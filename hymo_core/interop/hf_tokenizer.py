"""The corpus tokenizer as transformers reads it: tokenizer.json byte for byte, plus tokenizer_config.json.

`PreTrainedTokenizerFast` over the same file encodes exactly as the shards stage did when
`split_special_tokens` is on (a document's literal "<|endoftext|>" stays text, the stage's
`encode_special_tokens`), adds no BOS/EOS, and decodes without space clean-up, so ids and text
round-trip unchanged. EOS is the corpus's EOS id; pad is "<|pad|>" where the tokenizer has it,
else EOS.

Byte tokens: the tokenizer stage's default is a byte-level BPE, whose 256 byte symbols are ordinary
base tokens of the vocabulary; it has no `<0xXX>` ids. Only seed 000's optional layout
(`byte_fallback_layout = true`) appends 256 `<0xXX>` ids after the BPE part; those are reserved,
never produced by encoding, and stay where the tokenizer put them. hymo_export.json records which:
`byte_tokens`, the number of `<0xXX>` ids in the vocabulary (0 or 256).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

PAD_TOKEN = "<|pad|>"
BYTE_TOKEN = re.compile(r"<0x[0-9A-F]{2}>")


def byte_token_count(tokenizer_file: Path) -> int:
    """How many `<0xXX>` ids the vocabulary (BPE part and added tokens) holds."""
    spec = json.loads(tokenizer_file.read_text(encoding="utf-8"))
    names = set(spec["model"].get("vocab", {})) | {entry["content"] for entry in spec.get("added_tokens", [])}
    return sum(1 for name in names if BYTE_TOKEN.fullmatch(name))


def special_ids(tokenizer_file: Path, eos_id: int) -> tuple[str, str, int]:
    """(EOS text, pad text, pad id) from the tokenizer's added tokens."""
    added = {entry["id"]: entry["content"] for entry in json.loads(tokenizer_file.read_text(encoding="utf-8"))["added_tokens"]}
    if eos_id not in added:
        raise ValueError(f"{tokenizer_file}: EOS id {eos_id} is not one of the tokenizer's added tokens")
    by_text = {text: token_id for token_id, text in added.items()}
    pad = PAD_TOKEN if PAD_TOKEN in by_text else added[eos_id]
    return added[eos_id], pad, by_text[pad]


def write_hf_tokenizer(tokenizer_file: Path, out: Path, eos_id: int, max_length: int) -> dict[str, Any]:
    """Copy tokenizer.json into `out` and write its tokenizer_config.json; returns the special ids."""
    eos, pad, pad_id = special_ids(tokenizer_file, eos_id)
    shutil.copyfile(tokenizer_file, out / "tokenizer.json")
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast", "backend": "tokenizers",
        "eos_token": eos, "pad_token": pad, "bos_token": None, "unk_token": None,
        "add_bos_token": False, "add_eos_token": False, "split_special_tokens": True,
        "clean_up_tokenization_spaces": False, "model_max_length": max_length,
        "padding_side": "left",  # batched generation with a causal model
    }
    (out / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    return {"eos_token_id": eos_id, "pad_token_id": pad_id, "eos_token": eos, "pad_token": pad, "byte_tokens": byte_token_count(tokenizer_file)}
