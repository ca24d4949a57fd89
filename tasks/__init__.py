"""HyMo tasks."""
