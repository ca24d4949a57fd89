"""`python -m hymo_core.train` (and `torchrun -m hymo_core.train`): one training run from a recipe."""
from hymo_core.train.run import main

raise SystemExit(main())
