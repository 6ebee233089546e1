"""frugal.launch: the one torchrun launcher (job schema, worker entry, per-rank logs)."""
