"""frugal.tgraph: a fair temporal-GNN benchmark (Benchtemp, and better)."""
