"""An ablation spec (`hymo ablate SPEC.toml`): a base pipeline, a proxy recipe, seeds, a decision rule, variants.

    base = "pipeline.toml"          # a pipeline config (relative to this file); omitted: the bundled sample
    base_run = "runs/sample"        # optional: a run of that config whose stages the base reuses
    seeds = [0, 1]                  # >= 2: every variant trains once per seed, paired with the base's run
    suite = ["hellaswag", "arc_easy"]
    suite_limit = 50                # items per suite task (the first N, as lm-eval's --limit)

    [proxy.train]                   # over [pretrain.train]: the token budget (steps x batch x seq_len) and recipe
    max_steps = 200
    [proxy.model]                   # over [pretrain.model]
    preset = "hymo-tiny"

    [decision]                      # fixed before training (hymo_core/ablate/rule.py)
    metric = "heldout_bpb"
    min_effect = 0.01
    confidence = 0.95               # Student's t interval at the errors' degrees of freedom (z = K: a fixed K se)
    every_seed = true

    [[variant]]
    name = "prose profile"
    quality = { profile = "prose" } # any pipeline section: quality, dedup_fuzzy, quality_model, mixture, filters, ...
    [[variant]]
    name = "MoE off"
    model = { moe_on = "" }         # over the proxy's model (GDN layer_pattern / heads, MLA ranks, MoE, ...)
    [[variant]]
    name = "AdamW only"
    train = { optimizer = "muon_adamw" }

A variant's tables merge into the base's (lists, such as `filters`, are replaced: `filters = []` turns
the user filters off). The spec's sha256 is recorded before the first run; the verdicts refuse a spec
that changed since.
"""
from __future__ import annotations

import hashlib
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hymo_core.ablate.rule import DecisionRule, RuleError

from flows.config import PACKAGE_DIR, PipelineConfig, load_config

BASE = "base"
RESERVED = {"name", "model", "train"}  # variant keys that are not pipeline sections
SPEC_KEYS = {"base", "base_run", "seeds", "suite", "suite_limit", "proxy", "decision", "variant"}
DEFAULT_SUITE = ("hellaswag", "arc_easy")
SAMPLE_SPEC = PACKAGE_DIR / "configs" / "ablate_sample.toml"  # the sample's two ablations (bench/ablate.py, `hymo serve`'s form)


class SpecError(ValueError):
    """A spec that cannot run: the message names the file, the variant and the reason."""


@dataclass(frozen=True)
class Variant:
    name: str
    pipeline: dict[str, Any] = field(default_factory=dict)  # pipeline sections to merge
    model: dict[str, Any] = field(default_factory=dict)
    train: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class AblationSpec:
    path: Path
    sha256: str
    base_config: PipelineConfig  # with the proxy recipe applied
    base_run: Path | None
    seeds: tuple[int, ...]
    rule: DecisionRule
    variants: tuple[Variant, ...]
    suite: tuple[str, ...] = DEFAULT_SUITE
    suite_limit: int = 50

    def config(self, variant: str, seed: int) -> PipelineConfig:
        """The pipeline config of one proxy run: the base (with the proxy), the variant's tables, the seed."""
        chosen = Variant(BASE) if variant == BASE else next(v for v in self.variants if v.name == variant)
        return merge(self.base_config, {**chosen.pipeline, "pretrain": {"model": chosen.model, "train": {**chosen.train, "seed": seed}}},
                     f"{self.path} variant {variant!r}")

    @property
    def names(self) -> list[str]:
        return [BASE] + [v.name for v in self.variants]


def deep_merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in over.items():
        out[key] = deep_merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def merge(config: PipelineConfig, over: dict[str, Any], where: str) -> PipelineConfig:
    """`config` with `over` merged in. A `preset` in the model table replaces the model (expanded as in a pipeline
    TOML) and puts its training defaults beneath the table's own train keys."""
    from hymo_core.models.presets import expand_preset, preset_training

    over = {**over, "pretrain": dict(over.get("pretrain", {}))}
    model = over["pretrain"].pop("model", {})
    values = deep_merge(config.model_dump(mode="json"), over)
    try:
        if "preset" in model:
            values["pretrain"]["model"] = expand_preset(model, f"{where} [model]")
            values["pretrain"]["train"] = {**values["pretrain"]["train"], **preset_training(model), **over["pretrain"].get("train", {})}
        else:
            values["pretrain"]["model"] = {**values["pretrain"]["model"], **model}
        return PipelineConfig(**values)
    except (ValueError, TypeError) as error:
        raise SpecError(f"{where}: not a valid pipeline config ({' '.join(str(error).split())[:400]})") from None


def load_spec(path: str | Path) -> AblationSpec:
    path = Path(path).resolve()
    try:
        payload = path.read_bytes()
        raw = tomllib.loads(payload.decode("utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as error:
        raise SpecError(f"{path}: cannot read the ablation spec ({error})") from None
    unknown = set(raw) - SPEC_KEYS
    if unknown:
        raise SpecError(f"{path}: unknown keys {sorted(unknown)}; known: {', '.join(sorted(SPEC_KEYS))}")
    seeds = raw.get("seeds", [0, 1])
    if not (isinstance(seeds, list) and len(seeds) >= 2 and len(set(seeds)) == len(seeds)
            and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)):
        raise SpecError(f"{path}: seeds must list at least 2 distinct non-negative integers (a seed spread needs two), got {seeds!r}")
    try:
        rule = DecisionRule.from_dict(raw.get("decision", {}), str(path))
    except RuleError as error:
        raise SpecError(str(error)) from None
    except TypeError as error:
        raise SpecError(f"{path}: [decision] {error}") from None
    variants, names = [], {BASE}
    for number, table in enumerate(raw.get("variant", []), start=1):
        name = table.get("name")
        if not isinstance(name, str) or not name or name in names or "/" in name:
            raise SpecError(f"{path}: variant {number} needs a unique name without '/' (not {BASE!r}), got {name!r}")
        names.add(name)
        sections = {k: v for k, v in table.items() if k not in RESERVED}
        bad = [k for k in sections if k not in PipelineConfig.model_fields or k in ("sources", "config_dir", "pretrain")]
        if bad:
            raise SpecError(f"{path}: variant {name!r}: {', '.join(bad)} is not a pipeline section a variant may change "
                            "(model and train change the proxy)")
        variants.append(Variant(name, sections, dict(table.get("model", {})), dict(table.get("train", {}))))
    if not variants:
        raise SpecError(f"{path}: no [[variant]] to compare with the base")
    base_path = raw.get("base")
    base = load_config((path.parent / base_path) if base_path else None)
    proxy = raw.get("proxy", {})
    base = merge(base, {"pretrain": {"model": proxy.get("model", {}), "train": proxy.get("train", {})}}, f"{path} [proxy]")
    base_run = raw.get("base_run")
    spec = AblationSpec(path, hashlib.sha256(payload).hexdigest(), base, (path.parent / base_run).resolve() if base_run else None,
                        tuple(seeds), rule, tuple(variants), tuple(raw.get("suite", DEFAULT_SUITE)), int(raw.get("suite_limit", 50)))
    for variant in spec.variants:  # every variant's config must build before anything trains
        spec.config(variant.name, seeds[0])
    return spec
