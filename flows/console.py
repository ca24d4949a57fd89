"""The one rich console every `hymo` subcommand prints to (so tests and subcommands share its width)."""
from rich.console import Console

console = Console()
