"""Helpers for tests: multi-process torchrun jobs on loopback (`run_torchrun`)."""

from frugal.testing.distributed import TorchrunResult, free_port, run_torchrun

__all__ = ["TorchrunResult", "free_port", "run_torchrun"]
