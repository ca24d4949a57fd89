"""The training core, usable without Prefect or the data stages:

    models/       model configs, presets, the blocks (layers/) and the model
    kernels/      Triton kernels, each beside its PyTorch reference
    train/        the loop, its config, LR schedule, optimizers, token loader
    checkpoint/   single-file and DCP (sharded) checkpoints behind one loader
    distributed/  process group, FSDP2 wiring, the torchrun launcher
    eval/         validation, cloze, the benchmark suite, the code sandbox, reports
    cpt/          continued pretraining: the gate, replay, the run
    planner/      parameter, FLOP and memory arithmetic (and `hymo plan`)
    exit_codes    the one exit-code table of every training and judging entry point

`python -m hymo_core.train` trains from a recipe (also under torchrun).

May import: `manifests` (digests, benchmark files). Never `flows`, `tasks` or Prefect.
"""
