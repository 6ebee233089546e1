"""Launch a training job: N trainer processes under torchrun on 127.0.0.1, with a timeout.

torchrun (`python -m torch.distributed.run`) runs a c10d rendezvous on a free loopback port;
the same trainer module runs unchanged under a multi-machine torchrun command line.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from frugal.config import config_to_dict
from frugal.recsys.errors import RecsysError
from frugal.recsys.trainer import RecsysTrainConfig

__all__ = ["launch_training"]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def launch_training(
    config: RecsysTrainConfig, out_dir: Path, *, timeout_s: float = 600.0
) -> dict[str, Any]:
    """Run `config` as `config.nproc` torchrun processes; return rank 0's result.

    Args:
        config: The training job.
        out_dir: Folder for `config.json`, `result.json`, `torchrun.log` and PS files.
        timeout_s: Wall-clock limit of the whole job; the process group is killed after it.

    Returns:
        The content of `result.json`.

    Raises:
        RecsysError: If the job fails or times out (the log's tail is in the message).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    config_path = out_dir / "config.json"
    config_path.write_text(json.dumps(config_to_dict(config), indent=1) + "\n")
    result_path = out_dir / "result.json"
    result_path.unlink(missing_ok=True)
    command = [
        sys.executable, "-m", "torch.distributed.run",
        "--nnodes", "1",
        "--nproc-per-node", str(config.nproc),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"127.0.0.1:{_free_port()}",
        "--max-restarts", "0",
        "-m", "frugal.recsys.trainer", str(config_path), str(out_dir),
    ]  # fmt: skip
    env = dict(os.environ)
    env.update(
        OMP_NUM_THREADS="1",
        GLOO_SOCKET_IFNAME=env.get("GLOO_SOCKET_IFNAME", "lo"),
        TP_SOCKET_IFNAME=env.get("TP_SOCKET_IFNAME", "lo"),
        PYTHONWARNINGS="ignore",
    )
    log_path = out_dir / "torchrun.log"
    with open(log_path, "wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
        try:
            code = process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            code = None
    if code != 0 or not result_path.exists():
        tail = log_path.read_text(errors="replace")[-3000:]
        what = f"timed out after {timeout_s} s" if code is None else f"exited with {code}"
        raise RecsysError(f"recsys training ({config.mode}) {what}; log {log_path}:\n{tail}")
    result: dict[str, Any] = json.loads(result_path.read_text())
    return result
