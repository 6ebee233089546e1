"""Direct multi-process launch for pipeline tests, without the torchrun agent.

No agent, so a killed rank's peers must notice by themselves: N worker processes on
127.0.0.1 with env:// rendezvous.

It differs from `frugal.launch.run_torchrun` on purpose: torchrun's agent would restart or
stop the peers of a killed rank itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from frugal.config import config_to_dict
from frugal.launch import free_port
from frugal.pipeline.train import PipelineTrainConfig, RunSpec

SRC = str(Path(__file__).resolve().parents[2] / "src")


def write_job(path: Path, config: PipelineTrainConfig, runs: list[RunSpec]) -> Path:
    path.write_text(
        json.dumps({"config": config_to_dict(config), "runs": [asdict(r) for r in runs]})
    )
    return path


@dataclass
class Ranks:
    procs: list[subprocess.Popen[str]]

    def wait(self, timeout_s: float) -> list[tuple[int, str, str]]:
        """Exit code, stdout, stderr per rank; kills everything left after `timeout_s`."""
        out = []
        for proc in self.procs:
            try:
                stdout, stderr = proc.communicate(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                proc.kill()
                stdout, stderr = proc.communicate(timeout=10)
                stderr += "\n<killed by the test: timeout>"
            out.append((proc.returncode, stdout, stderr))
        return out

    def kill_all(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)


def start_ranks(jobs: list[Path], out_dir: Path) -> Ranks:
    """Start one `frugal.pipeline.worker` per job file (rank = index)."""
    port = free_port()
    procs = []
    for rank, job in enumerate(jobs):
        env = {
            **os.environ,
            "RANK": str(rank),
            "LOCAL_RANK": str(rank),
            "WORLD_SIZE": str(len(jobs)),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(port),
            "OMP_NUM_THREADS": "1",
            "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", ""),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "frugal.pipeline.worker", str(job), str(out_dir)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    return Ranks(procs)
