"""HyMo hymo_core."""
