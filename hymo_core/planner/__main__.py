"""`python -m hymo_core.planner [model] [--layers ...]`."""
from hymo_core.planner.cli import main

raise SystemExit(main())
