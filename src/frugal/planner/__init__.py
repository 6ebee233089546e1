"""Placing pipeline x data-parallel training on heterogeneous, geo-distributed devices.

Implements the scheduler of "Decentralized Training of Foundation Models in Heterogeneous
Environments" (NeurIPS 2022, arXiv 2206.01288): a cost model plus a search over placements.
Imports without torch.distributed.
"""

from frugal.planner.cost import PaperCost, paper_cost
from frugal.planner.scenarios import SCENARIOS, build_scenario
from frugal.planner.topology import Device, Topology

__all__ = ["SCENARIOS", "Device", "PaperCost", "Topology", "build_scenario", "paper_cost"]
