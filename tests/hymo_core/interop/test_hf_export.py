"""`hymo export --hf`: transformers loads the export and computes HyMo's logits, greedy text and token ids."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.usefixtures("one_torch_thread")

from hymo_core.checkpoint.load import load_model  # noqa: E402
from hymo_core.eval.evaluation import load_tokenizer, sample_tokens  # noqa: E402
from hymo_core.interop.hf_export import export_hf  # noqa: E402
from hymo_core.train.data import CorpusReader  # noqa: E402

SAMPLE = Path(__file__).resolve().parents[3] / "manifests" / "sample"

ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen3": "Qwen3ForCausalLM", "hymo-tiny": "HymoForCausalLM"}


def validation_batch(tiny_run: Path, batch: int = 3, length: int = 64) -> torch.Tensor:
    reader = CorpusReader(tiny_run)
    tokens = np.concatenate([np.asarray(t, dtype=np.int64) for t in reader.open_all("validation")])
    return torch.from_numpy(tokens[: batch * length].reshape(batch, length).copy())


@pytest.mark.parametrize("name", list(ARCHITECTURES))
def test_transformers_computes_hymos_logits_and_greedy_text(name: str, exports, checkpoints, tiny_run: Path):
    model, _ = load_model(checkpoints[name])
    hf = transformers.AutoModelForCausalLM.from_pretrained(exports[name], trust_remote_code=name == "hymo-tiny", dtype=torch.float32).eval()
    assert type(hf).__name__ == ARCHITECTURES[name]
    tokens_BT = validation_batch(tiny_run)
    with torch.no_grad():
        ours, _ = model(tokens_BT)
        theirs = hf(tokens_BT).logits
    assert theirs.dtype == torch.float32 and (ours - theirs).abs().max().item() <= 1e-5

    record = json.loads((exports[name] / "hymo_export.json").read_text())
    prompt = tokens_BT[0, :12].tolist()
    expected = sample_tokens(model, prompt, 24, 0.0, 0, torch.Generator(), record["eos_token_id"])
    generated = hf.generate(torch.tensor([prompt]), max_new_tokens=24, do_sample=False)[0, len(prompt):].tolist()
    assert generated[: len(expected)] == expected  # HyMo stops before EOS; transformers appends it and stops
    assert generated[len(expected):] in ([], [record["eos_token_id"]])


def test_hybrid_left_padded_batch_generates_as_each_prompt_alone(exports, checkpoints, tiny_run: Path):
    """Padding feeds zeros to the Gated DeltaNet state and is masked out of attention: the padded row is unchanged."""
    model, _ = load_model(checkpoints["hymo-tiny"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(exports["hymo-tiny"], trust_remote_code=True, dtype=torch.float32).eval()
    tokens_BT = validation_batch(tiny_run, 2, 20)
    short, long = tokens_BT[0, :12].tolist(), tokens_BT[1].tolist()
    pad = hf.generation_config.pad_token_id
    ids = torch.tensor([[pad] * 8 + short, long])
    mask = torch.tensor([[0] * 8 + [1] * 12, [1] * 20])
    out = hf.generate(ids, attention_mask=mask, max_new_tokens=10, do_sample=False, eos_token_id=None)
    assert out[0, 20:].tolist() == sample_tokens(model, short, 10, 0.0, 0, torch.Generator(), None)
    assert out[1, 20:].tolist() == sample_tokens(model, long, 10, 0.0, 0, torch.Generator(), None)


def test_tokenizer_round_trips_the_sample_documents(exports, tiny_run: Path):
    from tasks.corpus.split import iter_split_docs

    reader = CorpusReader(tiny_run)
    ours = load_tokenizer(reader.root / reader.manifest["tokenizer"]["path"])
    theirs = transformers.AutoTokenizer.from_pretrained(exports["llama"])
    assert type(theirs).__name__ in ("PreTrainedTokenizerFast", "TokenizersBackend")
    assert theirs.eos_token_id == reader.eos_id and theirs.bos_token_id is None
    texts = [text for side in ("train", "validation") for table in iter_split_docs(tiny_run / "04_split", side, ["text"])
             for text in table.column("text").to_pylist()]
    assert len(texts) > 90 and any("<|endoftext|>" in t for t in texts)  # the literal EOS text stays text
    for path in (SAMPLE / "prose-enwiki" / "enwiki.jsonl", SAMPLE / "multilingual" / "multilingual.jsonl"):  # the bundled sample
        texts += [json.loads(line)["text"] for line in path.read_text(encoding="utf-8").splitlines()[:50]]
    for text in texts:
        ids = theirs(text)["input_ids"]
        assert ids == ours.encode(text, add_special_tokens=False).ids
        assert theirs.decode(ids) == text


def test_export_is_reproducible_and_never_overwrites(checkpoints, exports, tiny_run: Path, tmp_path: Path):
    again = tmp_path / "again"
    record = export_hf(checkpoints["hymo-tiny"], again, corpus=tiny_run)
    for name in ("model.safetensors", "config.json", "tokenizer.json", "modeling_hymo.py"):
        assert (again / name).read_bytes() == (exports["hymo-tiny"] / name).read_bytes()
    assert record["architecture"] == "HymoForCausalLM" and record["trust_remote_code"]
    assert any("mtp" in item for item in record["left_out"])
    with pytest.raises(FileExistsError, match="not an empty directory"):
        export_hf(checkpoints["hymo-tiny"], again, corpus=tiny_run)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["again"]  # no half-built directory left beside it


def test_tokenizer_with_seed_000s_byte_id_layout_keeps_ids_and_specials(tmp_path: Path):
    """The 256 `<0xXX>` ids after the BPE part stay where they are; literal special-token text stays text."""
    from hymo_core.interop.hf_tokenizer import write_hf_tokenizer
    from tasks.corpus.tokenizer import BYTE_TOKENS, TokenizerConfig, build_tokenizer

    texts = ["The river ran quietly past the old mill.", "数据清洗之后语料由多个来源组成 🙂", "def f(x):\n    return x + 1\n"] * 5
    ours = build_tokenizer(texts, TokenizerConfig(vocab_size=320, byte_fallback_layout=True, min_frequency=1))
    ours.save(str(tmp_path / "tokenizer.json"))
    (tmp_path / "hf").mkdir()
    specials = write_hf_tokenizer(tmp_path / "tokenizer.json", tmp_path / "hf", eos_id=0, max_length=64)
    theirs = transformers.AutoTokenizer.from_pretrained(tmp_path / "hf")
    assert specials["pad_token"] == "<|pad|>" and theirs.pad_token_id == specials["pad_token_id"] == ours.token_to_id("<|pad|>")
    assert [theirs.convert_tokens_to_ids(t) for t in BYTE_TOKENS] == [ours.token_to_id(t) for t in BYTE_TOKENS]
    for text in texts + ["a literal <|endoftext|> and <0x41> stay text", "  leading and trailing spaces  "]:
        ids = theirs(text)["input_ids"]
        assert ids == ours.encode(text).ids and theirs.decode(ids) == text
    byte_a = ours.token_to_id("<0x41>")
    assert theirs.decode([byte_a]) == ours.decode([byte_a], skip_special_tokens=False) == "<0x41>"


def test_hybrid_remote_code_runs_the_gated_delta_rule_in_chunks(exports, checkpoints, tiny_run: Path, monkeypatch):
    """A prompt goes through Gated DeltaNet one chunk of 64 at a time (not one Python step per token) with
    HyMo's logits; over several chunks and a ragged tail, from a non-zero state, the chunked rule equals the
    per-token recurrence."""
    import sys

    model, _ = load_model(checkpoints["hymo-tiny"])
    hf = transformers.AutoModelForCausalLM.from_pretrained(exports["hymo-tiny"], trust_remote_code=True, dtype=torch.float32).eval()
    remote = sys.modules[type(hf).__module__]
    calls = []
    chunk = remote.gated_delta_chunk
    monkeypatch.setattr(remote, "gated_delta_chunk", lambda *args: calls.append(args[1].shape[-2]) or chunk(*args))
    T = model.config.max_seq_len
    tokens_BT = validation_batch(tiny_run, 2, T)
    with torch.no_grad():
        ours, _ = model(tokens_BT)
        theirs = hf(tokens_BT).logits
    gdn_layers = hf.config.layer_kinds.count("G")
    assert gdn_layers > 0 and len(calls) == gdn_layers * -(-T // remote.CHUNK)  # one call per chunk, not T steps
    assert (ours - theirs).abs().max().item() <= 1e-5

    generator = torch.Generator().manual_seed(0)
    B, T, H, K, V = 2, 3 * remote.CHUNK + 11, 2, 8, 6
    q, k = (torch.nn.functional.normalize(torch.randn(B, T, H, K, generator=generator), dim=-1) for _ in range(2))
    v = torch.randn(B, T, H, V, generator=generator)
    g = -torch.rand(B, T, H, generator=generator)  # log decays
    beta = torch.rand(B, T, H, generator=generator)
    h0 = torch.randn(B, H, K, V, generator=generator)
    o, h = remote.gated_delta_rule(q, k, v, g, beta, h0)
    expected, state = [], h0
    for t in range(T):  # the recurrence, one token at a time
        state = state * g[:, t, :, None, None].exp()
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhkv,bhk->bhv", state, k[:, t]))
        state = state + k[:, t, :, :, None] * u[:, :, None, :]
        expected.append(torch.einsum("bhkv,bhk->bhv", state, q[:, t]))
    assert torch.allclose(o, torch.stack(expected, 1), atol=1e-5) and torch.allclose(h, state, atol=1e-5)


@pytest.mark.parametrize("name", ["llama", "hymo-tiny"])
def test_config_json_names_rope_theta_dtype_and_transformers_version_for_other_tools(name: str, exports, checkpoints):
    from hymo_core.interop.hf_layout import TRANSFORMERS_VERSION

    model, _ = load_model(checkpoints[name])
    config = json.loads((exports[name] / "config.json").read_text())
    generation = json.loads((exports[name] / "generation_config.json").read_text())
    assert config["rope_theta"] == model.config.rope_base  # top level, as vLLM / llama.cpp converters read it
    if "rope_parameters" in config:
        assert config["rope_parameters"]["rope_theta"] == config["rope_theta"]
    assert config["torch_dtype"] == config["dtype"] == "float32"
    pin = next(line for line in (Path(__file__).resolve().parents[3] / "pyproject.toml").read_text().splitlines() if '"transformers>=' in line)
    assert config["transformers_version"] == TRANSFORMERS_VERSION and pin.split(">=")[1].split(",")[0] == TRANSFORMERS_VERSION.removesuffix(".0")
    assert generation["max_length"] == config["max_position_embeddings"] == model.config.max_seq_len  # the model's window
    loaded = transformers.AutoConfig.from_pretrained(exports[name], trust_remote_code=name == "hymo-tiny")  # still loads
    assert (loaded.rope_theta if name == "hymo-tiny" else loaded.rope_parameters["rope_theta"]) == model.config.rope_base


def test_a_changed_rope_base_reaches_config_json(checkpoints, tiny_run: Path, tmp_path: Path):
    """`hymo extend --position base` writes a new rope_base into the checkpoint; the export follows it."""
    payload = torch.load(checkpoints["llama"], map_location="cpu", weights_only=False)
    payload["model_config"]["rope_base"] = 40000.0
    extended = tmp_path / "step-00000003.pt"
    torch.save(payload, extended)
    export_hf(extended, tmp_path / "hf", corpus=tiny_run)
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["rope_theta"] == config["rope_parameters"]["rope_theta"] == 40000.0


def test_the_export_says_how_many_byte_tokens_the_vocabulary_has(exports, tmp_path: Path):
    """The default byte-level BPE has no <0xXX> ids (its bytes are base symbols); seed 000's layout has 256."""
    from hymo_core.interop.hf_tokenizer import byte_token_count
    from tasks.corpus.tokenizer import TokenizerConfig, build_tokenizer

    record = json.loads((exports["llama"] / "hymo_export.json").read_text())
    vocab = json.loads((exports["llama"] / "tokenizer.json").read_text())["model"]["vocab"]
    assert record["byte_tokens"] == sum(1 for token in vocab if token.startswith("<0x")) == 0
    layout = build_tokenizer(["The river ran quietly past the old mill."] * 5, TokenizerConfig(vocab_size=320, byte_fallback_layout=True, min_frequency=1))
    layout.save(str(tmp_path / "tokenizer.json"))
    assert byte_token_count(tmp_path / "tokenizer.json") == 256
