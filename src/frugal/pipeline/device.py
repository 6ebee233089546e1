"""Where a pipeline stage runs (CPU or one GPU per rank) and in which precision.

`resolve_device` turns the config's `device` ("auto", "cpu", "cuda") into "cpu" or "cuda" for
a machine running `num_local_ranks` processes, refusing a GPU that is not there before any
process starts; `rank_device` is the device of one local rank (`cuda:{local_rank}`) and
`process_group_backend` the torch.distributed backend that goes with it (gloo on CPU, NCCL on
GPUs). `Precision` is the mixed-precision recipe of a `dtype`: the matmuls and the activations
between stages (the wire, the codecs) in that dtype under `torch.autocast`, while the weights,
the optimizer state and the loss stay float32; float16 adds a static loss scale.

References:
    Mixed Precision Training, ICLR 2018, arXiv 1710.03740 (section 3: float32 master
    weights, float16 compute, loss scaling).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal, get_args

import torch

from frugal.config import ConfigError

__all__ = [
    "DEVICES",
    "DTYPES",
    "FLOAT16_LOSS_SCALE",
    "Precision",
    "process_group_backend",
    "rank_device",
    "resolve_device",
]

DeviceName = Literal["auto", "cpu", "cuda"]
DtypeName = Literal["float32", "bfloat16", "float16"]

DEVICES: tuple[str, ...] = get_args(DeviceName)
"""The accepted values of `PipelineTrainConfig.device`."""

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
"""`PipelineTrainConfig.dtype` -> the torch dtype of the compute and the activations."""

FLOAT16_LOSS_SCALE = 1024.0
"""Static loss scale of float16 runs: the last stage multiplies the loss by it and every stage
divides its weight gradients by it before the optimizer step, so small gradients survive
float16 (whose smallest normal value is 6.1e-5). A static scale, not torch's dynamic
GradScaler: a skipped step would have to be agreed by every stage; an overflow raises
NonFiniteError instead (Mixed Precision Training, ICLR 2018, arXiv 1710.03740, section 3.2)."""


def resolve_device(device: str, num_local_ranks: int = 1) -> Literal["cpu", "cuda"]:
    """The device type ("cpu" or "cuda") that `device` means here, for `num_local_ranks` ranks.

    "auto" is "cuda" when CUDA is available and every local rank can have a GPU of its own,
    else "cpu". "cuda" requires that.

    Args:
        device: "auto", "cpu" or "cuda".
        num_local_ranks: Processes on this machine (one per GPU on CUDA), >= 1.

    Returns:
        The device type every rank of this machine uses.

    Raises:
        ConfigError: If `device` is not one of `DEVICES`, or is "cuda" on a machine without
            CUDA or with fewer GPUs than local ranks.
    """
    if device not in DEVICES:
        raise ConfigError(f"device={device!r}; choose one of {', '.join(DEVICES)}")
    if device == "cpu":
        return "cpu"
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if gpus >= num_local_ranks:
        return "cuda"
    if device == "auto":
        return "cpu"
    if gpus == 0:
        raise ConfigError(
            f"--device cuda (device='cuda'), but torch {torch.__version__} sees no CUDA GPU on "
            "this machine; each rank needs a GPU of its own: use --device cpu (or auto), or "
            "install a CUDA build of torch on a machine with a GPU"
        )
    raise ConfigError(
        f"--device cuda (device='cuda') with {num_local_ranks} processes on this machine, but "
        f"it has {gpus} GPU(s); each rank needs a GPU of its own: use at most {gpus} stages "
        "per machine (--stages, or --nnodes), or --device cpu"
    )


def rank_device(device_type: str, local_rank: int) -> torch.device:
    """The device of local rank `local_rank`: `cuda:{local_rank}`, or the CPU."""
    return torch.device("cuda", local_rank) if device_type == "cuda" else torch.device("cpu")


def process_group_backend(device_type: str) -> Literal["gloo", "nccl"]:
    """The torch.distributed backend of `device_type`: NCCL on GPUs, gloo on the CPU."""
    return "nccl" if device_type == "cuda" else "gloo"


@dataclass(frozen=True, slots=True)
class Precision:
    """How a stage computes: `dtype` under autocast, float32 weights, float32 loss.

    Args:
        device: Where the stage runs.
        dtype: The compute and activation dtype (torch.float32: no autocast).
    """

    device: torch.device
    dtype: torch.dtype = torch.float32

    @property
    def loss_scale(self) -> float:
        """The static loss scale: `FLOAT16_LOSS_SCALE` for float16, else 1."""
        return FLOAT16_LOSS_SCALE if self.dtype == torch.float16 else 1.0

    @contextlib.contextmanager
    def autocast(self) -> Iterator[None]:
        """Run the enclosed forward in `dtype` (no-op for float32)."""
        if self.dtype == torch.float32:
            yield
            return
        with torch.autocast(self.device.type, dtype=self.dtype):
            yield
