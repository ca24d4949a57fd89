"""HyMo manifests."""
