"""HyMo flows."""
