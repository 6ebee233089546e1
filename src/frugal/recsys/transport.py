"""Transports between trainers and PS shards: torch.distributed.rpc, or in-process.

A `ShardServer` (one per process in `rpc` mode) owns an `EmbeddingShard` and, in `async`
mode, a `DenseShard`. A transport runs a named operation on a destination's server and
returns a handle with `.wait()`; every wait has a timeout. The round-trip knob `rtt_ms`
sleeps on the serving thread before the operation (a sleep, so it costs no CPU, and calls in
flight overlap as they would on a real link).
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from frugal.launch.group import RENDEZVOUS_URL
from frugal.recsys.errors import PSUnavailableError
from frugal.recsys.ps import DenseShard, EmbeddingShard

__all__ = ["Handle", "LocalTransport", "RpcTransport", "ShardServer", "Transport"]


class ShardServer:
    """What one process serves: an embedding shard and maybe a dense chunk."""

    def __init__(self, shard: EmbeddingShard, dense: DenseShard | None, rtt_ms: float) -> None:
        self.shard = shard
        self.dense = dense
        self.rtt_s = rtt_ms / 1000.0

    def handle(self, op: str, args: tuple[Any, ...]) -> Any:
        """Run an operation of the shard (or the dense chunk) after the delay.

        `op` is "lookup", "lookahead", "push", "stats", "dense_pull" or "dense_push".

        Raises:
            ValueError: If `op` is unknown or needs a dense shard this server lacks.
        """
        if self.rtt_s > 0:
            time.sleep(self.rtt_s)
        if op == "lookup":
            return self.shard.lookup(*args)
        if op == "lookahead":
            return self.shard.lookahead(*args)
        if op == "push":
            return self.shard.push(*args)
        if op == "stats":
            return self.shard.stats()
        if self.dense is None:
            raise ValueError(f"op {op!r} needs a dense shard; this server has none")
        if op == "dense_pull":
            return self.dense.pull()
        if op == "dense_push":
            return self.dense.push(*args)
        raise ValueError(f"unknown PS operation {op!r}")


class Handle(Protocol):
    """An operation in flight."""

    def wait(self) -> Any:
        """Block until the result arrives (or raise `PSUnavailableError` after the timeout)."""
        ...

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call `fn()` (on some transport thread) once the result or an error is there."""
        ...


class Transport(Protocol):
    """Runs operations on PS shards."""

    def call(self, dst: int, op: str, *args: Any) -> Handle:
        """Start `op(*args)` on shard `dst`'s server; return its handle."""
        ...

    def close(self) -> None:
        """Stop serving and release threads."""
        ...


class _FutureHandle:
    """A handle over a concurrent.futures or torch Future with a timeout."""

    def __init__(
        self, future: Any, dst: int, op: str, timeout_s: float, torch_future: bool
    ) -> None:
        self._future = future
        self._dst, self._op, self._timeout_s = dst, op, timeout_s
        self._torch = torch_future

    def wait(self) -> Any:
        """The result; `PSUnavailableError` after the timeout."""
        try:
            if self._torch:
                return self._future.wait()
            return self._future.result(timeout=self._timeout_s)
        except (TimeoutError, concurrent.futures.TimeoutError) as exc:
            raise PSUnavailableError(
                f"PS shard {self._dst} did not answer {self._op!r} within {self._timeout_s} s; "
                "check that its trainer is alive (raise timeout_s for slow links)"
            ) from exc
        except RuntimeError as exc:
            if "timeout" in str(exc).lower() or "timed out" in str(exc).lower():
                raise PSUnavailableError(
                    f"PS shard {self._dst} did not answer {self._op!r} within "
                    f"{self._timeout_s} s: {exc}"
                ) from exc
            raise

    def add_done_callback(self, fn: Callable[[], None]) -> None:
        """Call `fn()` once the call finished (successfully or not)."""
        self._future.add_done_callback(lambda _f: fn())


class LocalTransport:
    """In-process transport over a list of servers (unit tests, one-process runs)."""

    def __init__(
        self, servers: list[ShardServer], timeout_s: float = 60.0, threads: int = 8
    ) -> None:
        self.servers = servers
        self.timeout_s = timeout_s
        self._pool = concurrent.futures.ThreadPoolExecutor(max_workers=threads)

    def call(self, dst: int, op: str, *args: Any) -> Handle:
        """Run `op` on server `dst` in the thread pool."""
        future = self._pool.submit(self.servers[dst].handle, op, args)
        return _FutureHandle(future, dst, op, self.timeout_s, torch_future=False)

    def close(self) -> None:
        """Wait for calls in flight and stop the threads."""
        self._pool.shutdown(wait=True)


_LOCAL_SERVER: list[ShardServer] = []  # the server of this process in rpc mode
_SERVER_READY = threading.Event()


def _serve(op: str, args: tuple[Any, ...]) -> Any:
    """RPC entry point: run `op` on this process's server."""
    if not _SERVER_READY.wait(timeout=60.0):
        raise RuntimeError("this process's PS shard was not started within 60 s")
    return _LOCAL_SERVER[0].handle(op, args)


class RpcTransport:
    """torch.distributed.rpc (TensorPipe) transport; worker names are `worker{rank}`.

    Start it after the torchrun rendezvous: `init_rpc` uses the same env:// rendezvous
    (MASTER_ADDR / MASTER_PORT), so the same code runs on one machine or many. One transport
    serves a sequence of jobs: `serve` swaps this process's server between them (callers
    put a barrier around the swap).

    TensorPipe's transport defaults to "uv" (TCP through libuv, epoll-driven): its "shm"
    transport busy-polls while a call is outstanding, which on a 2-core machine took 40 ms of
    CPU per sync step (measured) away from the other trainer.
    """

    def __init__(
        self,
        rank: int,
        world_size: int,
        timeout_s: float,
        threads: int = 16,
        transports: tuple[str, ...] = ("uv",),
    ) -> None:
        import torch.distributed.rpc as rpc

        self.rank, self.world_size, self.timeout_s = rank, world_size, timeout_s
        options = rpc.TensorPipeRpcBackendOptions(
            num_worker_threads=threads,
            rpc_timeout=timeout_s,
            init_method=RENDEZVOUS_URL,
            _transports=list(transports),
        )
        name = f"worker{rank}"
        # torch leaves init_rpc unannotated
        rpc.init_rpc(name, rank=rank, world_size=world_size, rpc_backend_options=options)  # type: ignore[no-untyped-call]
        self._rpc = rpc
        self._local_pool = concurrent.futures.ThreadPoolExecutor(
            max_workers=threads, thread_name_prefix="recsys-local-ps"
        )

    def serve(self, server: ShardServer | None) -> None:
        """Serve `server` from now on (None: stop serving; calls then wait for the next)."""
        _SERVER_READY.clear()
        _LOCAL_SERVER.clear()
        if server is not None:
            _LOCAL_SERVER.append(server)
            _SERVER_READY.set()

    def call(self, dst: int, op: str, *args: Any) -> Handle:
        """Send `op` to `worker{dst}` (asynchronously, with the timeout).

        A call to this process's own shard skips TensorPipe (no serialisation): it runs on a
        local thread pool, through the same server and the same `rtt_ms` delay.
        """
        if dst == self.rank:
            local = self._local_pool.submit(_serve, op, args)
            return _FutureHandle(local, dst, op, self.timeout_s, torch_future=False)
        future = self._rpc.rpc_async(
            f"worker{dst}", _serve, args=(op, args), timeout=self.timeout_s
        )
        return _FutureHandle(future, dst, op, self.timeout_s, torch_future=True)

    def close(self) -> None:
        """Graceful shutdown: waits for every worker's outstanding RPCs (a barrier)."""
        self._local_pool.shutdown(wait=True)
        self._rpc.shutdown(graceful=True, timeout=self.timeout_s)
        self.serve(None)
