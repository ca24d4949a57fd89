"""How a model is trained: `TrainConfig` (config), the step loop (trainer), the LR schedule
(schedule), the optimizers and their one parameter partition (optim, partition, optim_config),
the token and validation loaders (data), the recipe entry point (run, `python -m hymo_core.train`)
and its command-line arguments, importable without torch (arguments).
Watching a run: the seed's signals at log_interval (monitor), alerts with actions (alerts), the loss
forecast L(D) = L_inf + a D^-gamma (forecast), and `hymo report`'s HTML page (run_report).

May import: `hymo_core.models`, `hymo_core.kernels`, `hymo_core.planner`, `hymo_core.checkpoint`,
`hymo_core.distributed`, `hymo_core.eval` (validation during training).
"""
