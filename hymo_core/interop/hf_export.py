"""`hymo export CKPT --hf DIR`: a checkpoint as a directory transformers loads with `from_pretrained(DIR)`.

DIR holds config.json (hf_layout), model.safetensors (fp32, transformers' names), tokenizer.json
and tokenizer_config.json (hf_tokenizer), generation_config.json (greedy, the corpus's EOS and pad,
max_length = the model's window, max_position_embeddings: the hybrid has no RoPE table past it),
hymo_export.json (where it came from: checkpoint, step, weight and tokenizer digests, what was left
out) and, for the hybrid, the modeling files loaded with `trust_remote_code=True`. The directory is
built beside DIR and renamed into place, so a crash leaves no half export; the same checkpoint
exports to the same bytes. Neither transformers nor lm-eval is needed to export.
"""
from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from hymo_core.checkpoint.load import load_model
from hymo_core.checkpoint.tokenizer_identity import check_corpus_tokenizer
from hymo_core.interop.atomic_dir import new_directory
from hymo_core.interop.hf_layout import HYBRID, REMOTE_CODE_FILES, architecture, hf_config, hf_state_dict
from hymo_core.interop.hf_tokenizer import write_hf_tokenizer
from hymo_core.models.mup import output_multiplier
from hymo_core.train.data import CorpusReader
from manifests.digest import sha256_file

EXPORT_RECORD = "hymo_export.json"
WEIGHTS_FILE = "model.safetensors"



def _json(path: Path, payload: dict[str, Any]) -> None:
    path.write_text(json.dumps(payload, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def corpus_of(checkpoint: Path, payload: dict[str, Any], corpus: str | Path | None) -> CorpusReader:
    """The given corpus, or the one in the run directory above the checkpoint with the recorded digest."""
    from hymo_core.eval.report import find_corpus

    return CorpusReader(corpus, verify=False) if corpus else find_corpus(checkpoint, payload["manifest_digest"])


def export_hf(checkpoint: str | Path, out: str | Path, corpus: str | Path | None = None) -> dict[str, Any]:
    """Write the export into `out` (which must not exist or be empty); returns hymo_export.json's content."""
    from safetensors.torch import save_file

    checkpoint, out = Path(checkpoint), Path(out)
    model, payload = load_model(checkpoint)
    reader = corpus_of(checkpoint, payload, corpus)
    check_corpus_tokenizer(payload, checkpoint, reader)  # the export ships this tokenizer as the model's
    if reader.vocab_size > model.config.vocab_size:
        raise ValueError(f"{checkpoint}: vocab_size {model.config.vocab_size}, but the tokenizer of {reader.path} has {reader.vocab_size} ids")
    config = model.config
    if config.parametrisation == "mup":  # the Hugging Face models have no output multiplier (hymo_core/models/mup.py)
        raise ValueError(f"{checkpoint}: a muP model (parametrisation = \"mup\", logits x {output_multiplier(config):g}) "
                         "cannot be exported: the Hugging Face architectures have no output multiplier")
    if config.rope_position_scale != 1.0:
        raise ValueError(f"{checkpoint}: RoPE position interpolation (rope_position_scale {config.rope_position_scale:g}, hymo extend) "
                         "is not mapped to the Hugging Face configs; extend with --position base to export")
    with new_directory(out, "export") as work:
        tokenizer_file = reader.root / reader.manifest["tokenizer"]["path"]
        specials = write_hf_tokenizer(tokenizer_file, work, reader.eos_id, config.max_seq_len)
        arch = architecture(config)
        _json(work / "config.json", hf_config(config, specials["eos_token_id"], specials["pad_token_id"]))
        _json(work / "generation_config.json", {"eos_token_id": specials["eos_token_id"], "pad_token_id": specials["pad_token_id"],
                                                "bos_token_id": None, "do_sample": False, "max_length": config.max_seq_len})
        tensors = hf_state_dict(config, model.state_dict())
        save_file(tensors, work / WEIGHTS_FILE, metadata={"format": "pt"})
        if arch == HYBRID:
            code = resources.files("hymo_core.interop") / "remote_code"
            for name in REMOTE_CODE_FILES:
                (work / name).write_bytes((code / name).read_bytes())
        record = {
            "architecture": arch, "checkpoint": checkpoint.name, "step": payload["state"]["step"],
            "corpus_digest": reader.digest, "tokenizer_sha256": sha256_file(tokenizer_file),
            "weights_sha256": sha256_file(work / WEIGHTS_FILE), "tensors": len(tensors),
            "parameters": sum(t.numel() for t in tensors.values()), "trust_remote_code": arch == HYBRID,
            "left_out": (["mtp.* (multi-token prediction is training-only)"] if config.mtp_depth else [])
                        + (["MoE balancing counters (load EMA, token counts); the gate bias is kept"] if config.moe_on else []),
            **specials,
        }
        _json(work / EXPORT_RECORD, record)
    return record
