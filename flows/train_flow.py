"""The `hymo-train` flow: train (or continue training) on a corpus outside the pipeline, e.g. from `hymo serve`."""
from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger

from hymo_core.train.run import load_run_config, run_training, session_config


def default_out(corpus: str) -> Path:
    path = Path(corpus)
    return (path if path.is_dir() else path.parent) / "train"


@flow(name="hymo-train", log_prints=True)
def hymo_train(corpus: str, config: str | None = None, out: str | None = None, max_steps: int | None = None,
               resume: bool = True) -> dict[str, Any]:
    """`corpus`: a run directory, a shards stage directory or corpus.json; `config`: a TOML with [train] / [model]."""
    train_config, model_config = load_run_config(config)
    train_config = session_config(train_config, max_steps)  # stopping early keeps the recipe's LR horizon
    logger = get_run_logger()
    summary = run_training(corpus, out or default_out(corpus), train_config, model_config, resume=resume, log=logger.info)
    logger.info("step %s: train loss %.4f, validation loss %s, weights %s", summary["final_step"], summary["final_train_loss"] or float("nan"),
                summary["final_val_loss"], summary["weights_sha256"][:16])
    return summary
