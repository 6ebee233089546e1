"""frugal.parallel: the torch-free vocabulary that planner, pipeline and comm share.

Schedules, layer partitioning, codec wire sizes and the Plan document live here once, so
that what the planner prices is what the pipeline runs. Imports no torch.
"""
