"""The pipeline runtime: a stage runs its schedule's actions over a transport, with codecs.

`StageRunner` owns one stage's module, optimizer and the four link codecs around it (activation
in/out, gradient in/out). `LocalTransport` moves messages between stages in one process (the
exactness test and quality sweeps); `DistTransport` moves them with torch.distributed isend/irecv
(gloo on CPU, NCCL on GPUs), every Work waited on with a timeout, sends through the per-link
shaper of `frugal.comm.link`. Both carry the same header + payload, so bytes are counted the
same way. A stage runs on one device in one compute dtype (`frugal.pipeline.device.Precision`).

Shape legend: M micro-batch, T tokens, H hidden, V vocabulary.

References:
    Fine-tuning Language Models over Slow Networks using Activation Compression with
    Guarantees, NeurIPS 2022, arXiv 2206.01299 (AQ-SGD on the pipeline links).
"""

from __future__ import annotations

import collections
import datetime
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from frugal import FrugalError
from frugal.comm.buffers import BufferFactory
from frugal.comm.collectives import COLLECTIVES
from frugal.comm.gradcomp import DP_METHODS, DPSyncError, GradientSync
from frugal.comm.link import LinkError, LinkShaper, LinkSpec, SendHandle
from frugal.comm.message import (
    BufferDriftError,
    LinkCodec,
    NonFiniteMessageError,
    ProtocolError,
    all_finite,
    parse_header,
)
from frugal.comm.shaped import ShapedGroup
from frugal.parallel.codec import HEADER_BYTES, KIND_ACTIVATION, KIND_GRADIENT, CodecSpec
from frugal.parallel.schedule import Action
from frugal.pipeline.device import Precision
from frugal.pipeline.models import PipelineStage

__all__ = [
    "ConfigMismatchError",
    "DistTransport",
    "LocalTransport",
    "Microbatch",
    "NonFiniteError",
    "PeerLostError",
    "PipelineError",
    "StageRunner",
    "ring_allreduce_s",
    "run_local_step",
]


class PipelineError(FrugalError):
    """A pipeline run failed."""


class PeerLostError(PipelineError):
    """A peer rank did not answer within the timeout or closed its connection."""

    def __init__(
        self, *, rank: int, stage: int, peer: int, op: str, step: int, mb: int, cause: str
    ) -> None:
        super().__init__(
            f"rank {rank} (stage {stage}) lost peer rank {peer} during {op} at step {step}, "
            f"micro-batch {mb}: {cause}"
        )
        self.rank, self.stage, self.peer, self.op, self.step, self.mb = (
            rank,
            stage,
            peer,
            op,
            step,
            mb,
        )


class ConfigMismatchError(PipelineError):
    """Ranks started with different configurations (the message names keys and ranks)."""


class NonFiniteError(PipelineError):
    """NaN or inf in an activation, gradient or loss."""

    def __init__(self, *, stage: int, step: int, mb: int, tensor: str) -> None:
        where = f"micro-batch {mb}" if mb >= 0 else "after all its micro-batches"
        super().__init__(
            f"NaN/inf in the {tensor} at step {step}, stage {stage}, {where}; lower the "
            "learning rate or use more codec bits"
        )
        self.stage, self.step, self.mb, self.tensor = stage, step, mb, tensor


class Handle(Protocol):
    """An in-flight send."""

    def wait(self, timeout_s: float) -> None:
        """Block until it completed."""
        ...


class Transport(Protocol):
    """Moves (header, payload) between stages; `tag` 0 = activations, 1 = gradients."""

    def post(
        self, peer: int, tag: int, header: Tensor, payload: Tensor, *, step: int, mb: int
    ) -> Handle:
        """Send a message to stage `peer`; returns at once."""
        ...

    def fetch(
        self, peer: int, tag: int, *, step: int, mb: int, payload_bytes: int | None
    ) -> tuple[Tensor, Tensor]:
        """Receive the next message from stage `peer` with `tag`.

        `payload_bytes` is the size after the header (None: unknown, which only transports
        that take any size accept).
        """
        ...

    def prepost(self, peer: int, tag: int, *, step: int, mb: int, payload_bytes: int) -> None:
        """Start receiving the next message from `peer` with `tag` before it is fetched.

        The next `fetch` of (peer, tag) must then ask for this same (step, mb, size).
        """
        ...


class _Done:
    def wait(self, timeout_s: float) -> None:
        return None


class LocalTransport:
    """In-process queues between the stages of one process (sends complete at once)."""

    def __init__(self) -> None:
        self._queues: dict[tuple[int, int, int], collections.deque[tuple[Tensor, Tensor]]] = (
            collections.defaultdict(collections.deque)
        )
        self.stage = 0
        """The stage currently executing (the local executor sets it)."""

    def post(
        self, peer: int, tag: int, header: Tensor, payload: Tensor, *, step: int, mb: int
    ) -> Handle:
        """Queue the message for stage `peer`."""
        self._queues[(self.stage, peer, tag)].append((header.clone(), payload.clone()))
        return _Done()

    def prepost(self, peer: int, tag: int, *, step: int, mb: int, payload_bytes: int) -> None:
        """Nothing to start: queued messages are already here (the size is checked at fetch)."""

    def has(self, src: int, dst: int, tag: int) -> bool:
        """Whether a message from `src` to `dst` with `tag` is waiting."""
        return bool(self._queues[(src, dst, tag)])

    def fetch(
        self, peer: int, tag: int, *, step: int, mb: int, payload_bytes: int | None = None
    ) -> tuple[Tensor, Tensor]:
        """Pop the oldest message from stage `peer`.

        Raises:
            PipelineError: If none is waiting (the executor ran an action too early).
            ProtocolError: If its payload is not `payload_bytes` long (when given): the size
                the distributed transport would have received.
        """
        queue = self._queues[(peer, self.stage, tag)]
        if not queue:
            raise PipelineError(f"stage {self.stage}: no message from stage {peer} (tag {tag})")
        header, payload = queue.popleft()
        if payload_bytes is not None and payload.numel() != payload_bytes:
            raise ProtocolError(
                f"stage {self.stage}: expected a {payload_bytes}-byte payload from stage {peer} "
                f"at step {step}, micro-batch {mb}, received {payload.numel()} bytes"
            )
        return header, payload


class DistTransport:
    """torch.distributed point-to-point between stage ranks, shaped per directed link.

    Args:
        rank: This process's global rank.
        stage: Its stage.
        peer_ranks: stage -> global rank of the neighbours in this rank's pipeline.
        links: (src rank, dst rank) -> LinkSpec of that directed link (missing = unshaped).
        timeout_s: Limit of every wait.
        device: Where received messages land (the stage's device: a GPU under NCCL).
    """

    def __init__(
        self,
        *,
        rank: int,
        stage: int,
        peer_ranks: dict[int, int],
        links: dict[tuple[int, int], LinkSpec],
        timeout_s: float,
        device: torch.device | None = None,
    ) -> None:
        self.rank, self.stage = rank, stage
        self.device = device if device is not None else torch.device("cpu")
        self.peer_ranks = peer_ranks
        self.timeout_s = timeout_s
        # Only shaped links get a shaper thread; an unshaped link sends from the caller's
        # thread, as torch's own pipelining does, without a hop through a queue.
        specs = {peer: links.get((rank, r), LinkSpec()) for peer, r in peer_ranks.items()}
        self.shapers = {
            peer: LinkShaper(spec, name=f"{rank}->{peer_ranks[peer]}")
            for peer, spec in specs.items()
            if spec.is_shaped
        }
        # (peer, tag) -> the posted receive: (step, mb, payload_bytes, buffer, work).
        self._preposted: dict[tuple[int, int], tuple[int, int, int, Tensor, dist.Work]] = {}

    def _wait(self, work: dist.Work, peer: int, op: str, step: int, mb: int) -> None:
        try:
            ok = work.wait(datetime.timedelta(seconds=self.timeout_s))
        except RuntimeError as exc:  # gloo: timeout or connection closed by a dead peer
            raise self._peer_lost(peer, op, step, mb, str(exc).splitlines()[0]) from exc
        if ok is False:
            raise self._peer_lost(peer, op, step, mb, f"no answer in {self.timeout_s} s")

    def _peer_lost(self, peer: int, op: str, step: int, mb: int, cause: str) -> PeerLostError:
        """The error of a transfer with `peer` that failed or timed out (this rank's view)."""
        return PeerLostError(
            rank=self.rank, stage=self.stage, peer=peer, op=op, step=step, mb=mb, cause=cause
        )

    def _isend(self, header: Tensor, payload: Tensor, dst: int, tag: int) -> dist.Work:
        # One buffer, one message: the receiver knows its size (`LinkCodec.payload_bytes`).
        message = torch.cat([header.view(torch.uint8), payload])
        work = dist.isend(message, dst, tag=tag)
        assert work is not None  # isend always returns a Work outside coalescing
        return work

    def post(
        self, peer: int, tag: int, header: Tensor, payload: Tensor, *, step: int, mb: int
    ) -> Handle:
        """Send the message to stage `peer` (through its link's shaper, if shaped).

        Returns:
            A handle whose `wait` returns once the real send completed.
        """
        dst = self.peer_ranks[peer]
        if peer not in self.shapers:
            return _WorkHandle(self, self._isend(header, payload, dst, tag), dst, step, mb)

        def send() -> None:
            self._wait(self._isend(header, payload, dst, tag), dst, "send", step, mb)

        return _CheckedHandle(
            self,
            self.shapers[peer].submit(header.numel() * 8 + payload.numel(), send),
            dst,
            step,
            mb,
        )

    def fetch(
        self, peer: int, tag: int, *, step: int, mb: int, payload_bytes: int | None
    ) -> tuple[Tensor, Tensor]:
        """Receive one message (header and `payload_bytes` of payload) from stage `peer`.

        Raises:
            ValueError: If `payload_bytes` is None (this transport must know the size).
            PeerLostError: If the peer does not answer in time or has gone (a message of
                another size also ends here: gloo fails the receive).
            ProtocolError: If the header is not a frugal header or announces another size.
        """
        if payload_bytes is None or payload_bytes < 0:
            raise ValueError(
                f"payload_bytes={payload_bytes}: the distributed transport receives one "
                "buffer of known size; give StageRunner the example_shape of its input"
            )
        src = self.peer_ranks[peer]
        posted = self._preposted.pop((peer, tag), None)
        if posted is None:
            message, work = self._irecv(src, tag, payload_bytes)
        else:
            posted_step, posted_mb, posted_bytes, message, work = posted
            if (posted_step, posted_mb, posted_bytes) != (step, mb, payload_bytes):
                raise ProtocolError(
                    f"stage {self.stage}: the receive posted ahead from stage {peer} was for "
                    f"step {posted_step}, micro-batch {posted_mb}, {posted_bytes} bytes; the "
                    f"schedule fetched step {step}, micro-batch {mb}, {payload_bytes} bytes"
                )
        self._wait(work, src, "recv", step, mb)
        header = message[:HEADER_BYTES].view(torch.int64)
        announced = parse_header(header)["payload_bytes"]
        if announced != payload_bytes:
            raise ProtocolError(
                f"rank {src} announced a {announced}-byte payload at step {step}, micro-batch "
                f"{mb}; expected {payload_bytes}: the ranks run different codecs or shapes"
            )
        return header, message[HEADER_BYTES:]

    def _irecv(self, src: int, tag: int, payload_bytes: int) -> tuple[Tensor, dist.Work]:
        message = torch.empty(HEADER_BYTES + payload_bytes, dtype=torch.uint8, device=self.device)
        work = dist.irecv(message, src, tag=tag)
        assert work is not None
        return message, work

    def prepost(self, peer: int, tag: int, *, step: int, mb: int, payload_bytes: int) -> None:
        """Post the receive of the next message from stage `peer` now (see `Transport`).

        gloo hands a message over only once its receive is posted (a rendezvous), so a
        receive posted before the compute that precedes it lets the transfer overlap that
        compute instead of following it.

        Raises:
            ProtocolError: If a receive from (peer, tag) is already posted.
        """
        if (peer, tag) in self._preposted:
            raise ProtocolError(
                f"stage {self.stage}: a receive from stage {peer} (tag {tag}) is already posted"
            )
        message, work = self._irecv(self.peer_ranks[peer], tag, payload_bytes)
        self._preposted[(peer, tag)] = (step, mb, payload_bytes, message, work)

    def close(self) -> None:
        """Stop the shaper threads."""
        for shaper in self.shapers.values():
            shaper.close()


class _WorkHandle:
    """The real send of one unshaped message; `wait` bounds it by the transport's timeout."""

    def __init__(
        self, transport: DistTransport, work: dist.Work, peer: int, step: int, mb: int
    ) -> None:
        self.transport, self.work, self.peer, self.step, self.mb = (
            transport,
            work,
            peer,
            step,
            mb,
        )

    def wait(self, timeout_s: float) -> None:
        self.transport._wait(self.work, self.peer, "send", self.step, self.mb)


class _CheckedHandle:
    def __init__(
        self, transport: DistTransport, handle: SendHandle, peer: int, step: int, mb: int
    ) -> None:
        self.transport, self.handle, self.peer, self.step, self.mb = (
            transport,
            handle,
            peer,
            step,
            mb,
        )

    def wait(self, timeout_s: float) -> None:
        t = self.transport
        try:
            self.handle.wait(timeout_s)
        except TimeoutError as exc:
            raise PeerLostError(
                rank=t.rank,
                stage=t.stage,
                peer=self.peer,
                op="send",
                step=self.step,
                mb=self.mb,
                cause=str(exc),
            ) from exc
        except LinkError as exc:
            if isinstance(exc.__cause__, PipelineError):
                raise exc.__cause__ from None
            raise


@dataclass(frozen=True, slots=True)
class Microbatch:
    """One micro-batch: example ids and, on the end stages, the tokens.

    Shapes:
        ids: (M,) int64 (on the CPU); inputs, targets: (M, T) int64 (moved to the stage's
        device when used).
    """

    ids: Tensor
    inputs: Tensor
    targets: Tensor


@dataclass(slots=True)
class StageStats:
    """What one stage measured."""

    forward_s: list[float] = field(default_factory=list)
    """Per forward action: wall seconds, minus time blocked in receives."""
    backward_s: list[float] = field(default_factory=list)
    forward_cpu_s: list[float] = field(default_factory=list)
    """Per forward action: CPU seconds of this thread (torch runs one thread per rank)."""
    backward_cpu_s: list[float] = field(default_factory=list)
    activation_bytes: list[list[int]] = field(default_factory=list)
    """Per step, wire bytes of each activation this stage sent (one per micro-batch)."""
    gradient_bytes: list[list[int]] = field(default_factory=list)
    """Per step, wire bytes of each input gradient this stage sent."""
    losses: list[float] = field(default_factory=list)
    """Last stage: mean micro-batch loss of each step."""
    step_s: list[float] = field(default_factory=list)
    optimizer_s: list[float] = field(default_factory=list)
    dp_bytes: list[int] = field(default_factory=list)
    """Per step: bytes this rank put into the gradient all-reduce."""
    """Per step: CPU seconds of the gradient all-reduce and optimizer step."""

    def median_forward_s(self) -> float:
        """Median forward seconds per micro-batch (0 if none)."""
        return statistics.median(self.forward_s) if self.forward_s else 0.0

    def median_backward_s(self) -> float:
        """Median backward seconds per micro-batch (0 if none)."""
        return statistics.median(self.backward_s) if self.backward_s else 0.0


def ring_allreduce_s(num_bytes: int, group_size: int, link: LinkSpec) -> float:
    """Network seconds of a ring all-reduce of `num_bytes` per member over `group_size`.

    2 (K - 1) steps, each moving num_bytes / K over the ring's bottleneck link and paying its
    latency: 2 (K - 1) (8 S / (K B) + latency); 0 for K = 1 or an unshaped link
    (`frugal.comm.collectives.RingCollective.network_s`).

    Raises:
        ValueError: If num_bytes < 0 or group_size < 1.
    """
    return COLLECTIVES.get("ring").network_s(num_bytes, group_size, link)


class StageRunner:
    """Runs one stage's actions: codecs on its links, its module and its optimizer.

    Args:
        module: The stage's layers.
        spec: Codec of every pipeline link.
        transport: Message mover.
        learning_rate: AdamW learning rate.
        num_microbatches_total: Micro-batches per step over all replicas (the loss of each is
            divided by it, so summed gradients are the macro-batch mean).
        dp_group: Process group of this stage's data-parallel replicas (None: no DP).
        dp_compression: How DP replicas agree (`frugal.comm.gradcomp.DP_METHODS`): "none"
            (fp32 sum by `dp_collective`), "fp16" / "powersgd" (torch's DDP comm hooks),
            "ef-kbit" (k-bit sharded parameter server with error feedback), "qadam" (AQ-SGD's
            reference: compressed Adam momentum, variance frozen after the warm-up) or one
            added by `frugal.comm.gradcomp.register_dp_method`.
        dp_bits: Bits of ef-kbit and qadam (1..8).
        buffers: AQ-SGD buffer factory per (link, side) name, e.g. `BufferSet.factory`
            (None: RAM).
        drift_check_every: Steps between AQ-SGD buffer checksum checks (0 = never).
        warmup_steps: Steps sent uncompressed (fp32) first.
        timeout_s: Limit of every wait.
        dp_links: LinkSpec of every directed pair of ranks for the DP group's traffic
            (None: torch.distributed's collectives on the real transport, unshaped). With it,
            every message of the DP exchange goes through its link's shaper
            (`frugal.comm.shaped.ShapedGroup`), so the exchange takes what its messages take.
        dp_collective: The collective the plan priced for this stage's DP group
            (`frugal.comm.collectives.COLLECTIVES`); "" = not planned (a ring, any method).
        example_shape: Shape of one example's input activation, e.g. (T, H) (None: unknown).
            A receiving stage computes each message's size from it, so the distributed
            transport (which needs the size) requires it on every stage but the first.
        precision: The stage's device and compute dtype (None: CPU, float32). The module
            must already be on that device; the forward runs under autocast in the dtype, the
            activations and gradients it sends have the dtype, the loss is float32.
    """

    def __init__(
        self,
        module: PipelineStage,
        spec: CodecSpec,
        transport: Transport,
        *,
        learning_rate: float,
        num_microbatches_total: int,
        dp_group: dist.ProcessGroup | None = None,
        dp_compression: str = "none",
        drift_check_every: int = 0,
        warmup_steps: int = 0,
        timeout_s: float = 120.0,
        dp_links: Mapping[tuple[int, int], LinkSpec] | None = None,
        dp_bits: int = 8,
        buffers: Callable[[str], BufferFactory] | None = None,
        example_shape: tuple[int, ...] | None = None,
        dp_collective: str = "",
        precision: Precision | None = None,
    ) -> None:
        self.module = module
        self.precision = precision or Precision(torch.device("cpu"))
        self.example_shape = example_shape
        self.stage = module.stage
        self.spec = spec
        self.transport = transport
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=learning_rate, weight_decay=0.0)
        self.scale = 1.0 / num_microbatches_total
        self.dp_group = dp_group
        self.dp_compression = dp_compression
        self.dp_sync: GradientSync | None = None
        if dp_group is not None:
            shaped = (
                ShapedGroup(dp_group, dp_links, timeout_s=timeout_s)
                if dp_links is not None and any(spec.is_shaped for spec in dp_links.values())
                else None
            )
            self.dp_sync = GradientSync(
                dp_compression,
                [p for p in module.parameters() if p.requires_grad],  # frozen weights: no traffic
                dp_group,
                bits=dp_bits,
                warmup_steps=warmup_steps,
                learning_rate=learning_rate,
                timeout_s=timeout_s,
                collective=dp_collective,
                shaped=shaped,
            )
        else:
            DP_METHODS.check(dp_compression)
        self.dp_collective = COLLECTIVES.get(dp_collective or "ring")
        self.drift_check_every = drift_check_every
        self.timeout_s = timeout_s
        s = self.stage
        send = buffers(f"link{s}-{s + 1}.send") if buffers is not None else None
        recv = buffers(f"link{s - 1}-{s}.recv") if buffers is not None else None
        self.act_out = LinkCodec(spec, KIND_ACTIVATION, warmup_steps, send)
        self.act_in = LinkCodec(spec, KIND_ACTIVATION, warmup_steps, recv)
        self.grad_out = LinkCodec(spec, KIND_GRADIENT, warmup_steps)
        self.grad_in = LinkCodec(spec, KIND_GRADIENT, warmup_steps)
        self.stats = StageStats()
        self._inputs: dict[int, Tensor] = {}
        self._outputs: dict[int, Tensor] = {}
        self._pending: list[Handle] = []
        self._step = 0
        self._mbs: Sequence[Microbatch] = ()
        self._losses: list[float] = []
        self._blocked_s = 0.0
        self._posted: Action | None = None  # the action whose receive is posted ahead

    def begin_step(self, step: int, microbatches: Sequence[Microbatch]) -> None:
        """Start a step over these micro-batches (in schedule index order)."""
        self._step, self._mbs, self._losses = step, microbatches, []
        self._posted = None
        self.stats.activation_bytes.append([0] * len(microbatches))
        self.stats.gradient_bytes.append([0] * len(microbatches))
        self.optimizer.zero_grad(set_to_none=True)

    def prefetch(self, ids: Tensor, step: int) -> None:
        """Hint the AQ-SGD buffers that the examples `ids` come at `step` (sample order)."""
        for codec in (self.act_in, self.act_out):
            if codec.delta is not None:
                codec.delta.prefetch(ids, step)

    def close_buffers(self) -> None:
        """Release the AQ-SGD buffers' files and threads."""
        for codec in (self.act_in, self.act_out):
            if codec.delta is not None:
                codec.delta.close()

    def needs(self, action: Action) -> tuple[int, int] | None:
        """(peer stage, tag) this action receives from, or None."""
        op, _ = action
        if op == "F" and not self.module.is_first:
            return self.stage - 1, KIND_ACTIVATION
        if op == "B" and not self.module.is_last:
            return self.stage + 1, KIND_GRADIENT
        return None

    def _send(self, codec: LinkCodec, peer: int, x: Tensor, j: int, what: str) -> int:
        check = self.drift_check_every > 0 and self._step % self.drift_check_every == 0
        header, payload, finite = codec.encode(x, self._mbs[j].ids, self._step, j, check)
        self._pending.append(
            self.transport.post(peer, codec.kind, header, payload, step=self._step, mb=j)
        )
        if not finite:  # the flagged header went out first, so the peer fails at once too
            raise NonFiniteError(stage=self.stage, step=self._step, mb=j, tensor=what)
        return HEADER_BYTES + payload.numel()

    def _expected_bytes(self, codec: LinkCodec, j: int) -> int | None:
        """Payload size of micro-batch j's message on `codec`'s link (None: not known yet)."""
        ids = self._mbs[j].ids
        # Activations have the input's shape, gradients the output's.
        shape: tuple[int, ...] | None = None
        if codec.kind == KIND_GRADIENT:
            if j in self._outputs:
                shape = tuple(self._outputs[j].shape)
        elif self.example_shape is not None:
            shape = (int(ids.numel()), *self.example_shape)
        return None if shape is None else codec.payload_bytes(shape, ids, self._step)

    def _prepost(self, action: Action | None) -> None:
        """Post the receive of `action` now if it has one, not posted yet, of known size.

        The codec state the size depends on is current: earlier messages are decoded.
        """
        if action is None or action == self._posted:
            return
        need = self.needs(action)
        if need is None:
            return
        peer, tag = need
        codec = self.act_in if tag == KIND_ACTIVATION else self.grad_in
        size = self._expected_bytes(codec, action[1])
        if size is None:
            return
        self.transport.prepost(peer, tag, step=self._step, mb=action[1], payload_bytes=size)
        self._posted = action

    def _receive(self, codec: LinkCodec, peer: int, j: int) -> Tensor:
        size = self._expected_bytes(codec, j)
        if codec.kind == KIND_GRADIENT and size is None:
            raise PipelineError(
                f"stage {self.stage}: backward of micro-batch {j} before its forward"
            )
        t0 = time.perf_counter()
        header, payload = self.transport.fetch(
            peer, codec.kind, step=self._step, mb=j, payload_bytes=size
        )
        self._blocked_s += time.perf_counter() - t0  # waiting is not compute
        try:
            fields = codec.expect(header, self._step, j)
        except NonFiniteMessageError as exc:
            what = "activation" if codec.kind == KIND_ACTIVATION else "gradient"
            raise NonFiniteError(
                stage=peer, step=self._step, mb=j, tensor=f"{what} received by stage {self.stage}"
            ) from exc
        try:
            return codec.decode(fields, payload, self._mbs[j].ids)
        except BufferDriftError as exc:
            raise BufferDriftError(
                f"stage {self.stage} (link {peer}->{self.stage}, receiver side): {exc}"
            ) from exc

    def run(self, action: Action, upcoming: Action | None = None) -> None:
        """Execute one action (receive, compute, send).

        Args:
            action: ("F" or "B", micro-batch index).
            upcoming: This stage's next action in the same step, whose receive is then posted
                as soon as its size is known (after this action's receive, else after its
                compute), so that the transfer overlaps this action's compute.

        Raises:
            NonFiniteError: On NaN/inf in an activation, gradient or loss.
            PeerLostError: If a peer is gone (distributed transport).
        """
        op, j = action
        mb = self._mbs[j]
        t0, cpu0 = time.perf_counter(), time.thread_time()
        self._blocked_s = 0.0
        if op == "F":
            device = self.precision.device
            if self.module.is_first:
                x: Tensor = mb.inputs.to(device, non_blocking=True)
            else:
                x = self._receive(self.act_in, self.stage - 1, j).requires_grad_(True)
            self._prepost(upcoming)
            with self.precision.autocast():
                out = self.module(x)
            if self.module.is_last:
                # The loss in float32 whatever the compute dtype (autocast's rule for it).
                targets = mb.targets.to(device, non_blocking=True).reshape(-1)
                loss = F.cross_entropy(out.float().reshape(-1, out.shape[-1]), targets)
                if not torch.isfinite(loss):
                    raise NonFiniteError(stage=self.stage, step=self._step, mb=j, tensor="loss")
                self._losses.append(float(loss.detach()))
                out = loss * (self.scale * self.precision.loss_scale)
            else:
                out = out.to(self.precision.dtype)  # the activation travels in the dtype
                sent = self._send(self.act_out, self.stage + 1, out.detach(), j, "activation")
                self.stats.activation_bytes[-1][j] = sent
            self._inputs[j], self._outputs[j] = x, out
            self.stats.forward_s.append(time.perf_counter() - t0 - self._blocked_s)
            self.stats.forward_cpu_s.append(time.thread_time() - cpu0)
        else:
            grad = None
            if not self.module.is_last:
                grad = self._receive(self.grad_in, self.stage + 1, j)
            self._prepost(upcoming)
            out = self._outputs.pop(j)
            torch.autograd.backward(out, grad)
            x = self._inputs.pop(j)
            if not self.module.is_first:
                assert x.grad is not None
                sent = self._send(self.grad_out, self.stage - 1, x.grad, j, "input gradient")
                self.stats.gradient_bytes[-1][j] = sent
            self.stats.backward_s.append(time.perf_counter() - t0 - self._blocked_s)
            self.stats.backward_cpu_s.append(time.thread_time() - cpu0)
        self._prepost(upcoming)  # a gradient's size is known once its forward ran

    def end_step(self) -> float | None:
        """Wait for the sends, all-reduce gradients over DP replicas, step the optimizer.

        Returns:
            The last stage's mean micro-batch loss, else None.

        Raises:
            NonFiniteError: If a parameter gradient holds NaN/inf.
            PeerLostError: If a send or the all-reduce does not complete in time.
        """
        for handle in self._pending:
            handle.wait(self.timeout_s)
        self._pending.clear()
        t0 = time.thread_time()
        grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if self.precision.loss_scale != 1.0:  # float16: undo the last stage's loss scale
            for g in grads:
                g.div_(self.precision.loss_scale)
        if self.dp_sync is not None and grads:
            if not all(all_finite(g) for g in grads):  # before compressing it
                raise NonFiniteError(
                    stage=self.stage, step=self._step, mb=-1, tensor="local weight gradient"
                )
            try:
                nbytes = self.dp_sync.step(self._step)
            except DPSyncError as exc:
                raise PipelineError(f"stage {self.stage}: {exc}") from exc
            self.stats.dp_bytes.append(nbytes)
            grads = [p.grad for p in self.module.parameters() if p.grad is not None]
        if grads and not all(all_finite(g) for g in grads):
            raise NonFiniteError(stage=self.stage, step=self._step, mb=-1, tensor="weight gradient")
        if self.dp_sync is not None and self.dp_sync.owns_optimizer:
            self.dp_sync.apply()
        else:
            self.optimizer.step()
        self.stats.optimizer_s.append(time.thread_time() - t0)
        if self.module.is_last:
            loss = sum(self._losses) / len(self._losses)
            self.stats.losses.append(loss)
            return loss
        return None

    def close(self) -> None:
        """Stop the threads of the shaped DP links (if any)."""
        if self.dp_sync is not None:
            self.dp_sync.close()


def run_local_step(
    runners: Sequence[StageRunner],
    transport: LocalTransport,
    actions: Sequence[Sequence[Action]],
    step: int,
    microbatches: Sequence[Microbatch],
) -> float:
    """Run one step of all stages in this process, interleaving their actions in order.

    Each stage runs its next action as soon as the message it needs is queued; the result is
    the same as the distributed run's (same actions, same codecs, same order per link).

    Returns:
        The last stage's mean micro-batch loss.

    Raises:
        PipelineError: If no stage can make progress (a schedule bug).
    """
    for runner in runners:
        runner.begin_step(step, microbatches)
    position = [0] * len(runners)
    while any(pos < len(a) for pos, a in zip(position, actions, strict=True)):
        progressed = False
        for s, runner in enumerate(runners):
            while position[s] < len(actions[s]):
                action = actions[s][position[s]]
                need = runner.needs(action)
                if need is not None and not transport.has(need[0], s, need[1]):
                    break
                transport.stage = s
                runner.run(action)
                position[s] += 1
                progressed = True
        if not progressed:
            raise PipelineError("local pipeline deadlock: no stage can run its next action")
    losses = [runner.end_step() for runner in runners]
    loss = losses[-1]
    assert loss is not None
    return loss
