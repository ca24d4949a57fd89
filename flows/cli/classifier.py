"""`hymo classifier train`: the fastText quality classifier the `quality_model` stage scores with."""
from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path
from typing import Any

from tasks.filters.quality_classifier import ClassifierTrainConfig, reproduce_command, train_classifier

SAMPLE_COMMAND = ("hymo classifier train --positives prose-enwiki --negatives python-docs "
                  "--negatives 'generated?label=navigation,spam,repeated_line,short' "
                  "--dim 32 --bucket 20000 --epoch 10 --chunk-words 64 --quantize --out manifests/models/quality-sample")


def train_config_from_args(args: argparse.Namespace) -> ClassifierTrainConfig:
    """The DCLM-shaped defaults with whatever the command line set."""
    return ClassifierTrainConfig(**{f.name: getattr(args, f.name) for f in fields(ClassifierTrainConfig) if getattr(args, f.name, None) is not None})


def cmd_classifier_train(args: argparse.Namespace) -> int:
    config = train_config_from_args(args)
    card = train_classifier(args.positives, args.negatives, Path(args.out), config, Path(args.work) if args.work else None,
                            command=reproduce_command())
    held = card["heldout"]
    print(f"{Path(args.out) / card['model']}: sha256 {card['sha256']}, {card['bytes']:,} bytes; "
          f"{card['training_data']['train_docs']} training documents; held out {held['docs']}: "
          f"precision {held['precision']:.3f} recall {held['recall']:.3f} AUC {held['auc']:.3f} at {held['threshold']}")
    if args.json:
        print(json.dumps(card, indent=2))
    return 0


def add_commands(sub: Any) -> None:
    classifier = sub.add_parser("classifier", help="the fastText quality classifier").add_subparsers(dest="classifier_command", required=True)
    train = classifier.add_parser("train", help="train on positive and negative sources; writes model.bin + model.json",
                                  description=f"The bundled sample model: {SAMPLE_COMMAND}")
    train.add_argument("--positives", action="append", required=True, metavar="SPEC",
                       help="reference text: bundled source name or spec TOML path, optionally SOURCE?key=v1,v2 (repeatable)")
    train.add_argument("--negatives", action="append", required=True, metavar="SPEC", help="random web text, same form (repeatable)")
    train.add_argument("--out", required=True, help="directory for model.bin and model.json")
    train.add_argument("--work", help="scratch directory for ingest/extract of the specs (default: a temporary one)")
    train.add_argument("--json", action="store_true", help="also print model.json")
    defaults = ClassifierTrainConfig()
    for f in fields(ClassifierTrainConfig):
        flag = "--" + f.name.replace("_", "-")
        if f.type in ("bool", bool):
            train.add_argument(flag, dest=f.name, action="store_true", default=None, help=f"(default: {getattr(defaults, f.name)})")
        else:
            kind = {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]
            train.add_argument(flag, dest=f.name, type=kind, help=f"(default: {getattr(defaults, f.name)})")
    train.set_defaults(func=cmd_classifier_train)
