"""NeurTW: neural temporal walks, a pair-scoring model (`scoring='pair'`) built on CAWN's parts.

For a query (src, dst, t), M temporal walks of L steps go backwards in time from src and
from dst with NeurTW's spatio-temporal bias (`frugal.tgraph.walks.sample_walks` with
`spatial_bias`): each step draws an earlier event of the current node from the mixture
(P_time + P_degree) / 2, P_time ~ exp(alpha (t' - t)) as CAWN's, P_degree ~
exp(-beta / (d + 0.01)) with d the neighbour's number of events before that event (walks
prefer neighbours that were already active). Walk nodes are anonymised by CAW's hitting
counts in both walk sets (`hitting_counts`, landing probabilities -> MLP, CAWN's
`WalkEncoder`). Each walk is then encoded in continuous time (`ContinuousWalkEncoder`): a
GRU jump at every walk step, and between steps a GRU-ODE flow of the hidden state over the
normalised time gap log10(1 + |t_i - t_(i+1)|) + 0.01, integrated with fixed-step RK4
(`rk4_integrate`, step 0.125 of the unit interval); one such encoder reads
[edge features || position encoding] per step, a second the position encodings alone
(as CAW's two `FeatureEncoder`s). The M walk vectors are projected, mean-pooled and
projected to D per endpoint, and CAW's `MergeLayer` (2 D -> D -> 1) gives the logit.

Loss: frugal's trainer (`frugal.tgraph.train.train_step`) has one loss for every model,
BCE on one positive and one random negative per event, and no per-model loss hook; NeurTW
is trained with it. The reference's InfoNCE-style loss (-log(f(s+) / (f(s+) + sum f(s-))),
f(s) = exp(sigmoid(s) / tau), tau = 0.1, Benchtemp's setting) is not used: a departure.

Defaults (the reference's CollegeMsg script `scripts/collegemsg_transductive.sh` and
`utils.get_args`): M = 32 walks (`--n_degree 32 1`), L = 2, alpha = 1e-5 per time unit
(`--temporal_bias`), beta = 1.0 (`--spatial_bias`), no exploration-exploitation bias
(`--ee_bias 0`), pos_dim = 108, RK4 step 0.125, mean pooling; D = `embedding_dim`.
Benchtemp ran it with train batch 32, eval batch 32, 30 epochs, early stopping patience 3
with tolerance 0, 1 run, dims 172; frugal's `benchtemp` preset does not set per-model batch
sizes or epochs (as for CAWN), so set them with `ProtocolConfig` overrides.

Departures from the reference code (KimMeen/Neural-Temporal-Walks, `module.py`, `graph.py`):
the BCE loss above; the anonymisation is CAW's landing-probability counts (`--pos_enc lp`;
the reference's CollegeMsg script uses `saw`); no node features and no zero edge features in
the step vector (frugal data has none; the reference feeds zero vectors); the GRU jump is
`torch.nn.GRUCell` (reset gate applied after the hidden projection; the reference's own cell
applies it before); a walk that stops early is encoded up to its last real step (the
reference runs on through padding with t = 0, so its gaps there depend on the query time);
RK4 is our 3/8-rule step in torch, differentiated directly (the reference uses torchdiffeq's
`odeint_adjoint`, whose 'rk4' is the same 3/8 rule); no walk-mutual attention (off by
default in the reference); walks see nothing at or after the batch's first event id under
`neighbor_bound='batch'`, and the degree bias counts a neighbour's events strictly before the
step's event in the finder's events.

Shape legend: W walks, L steps (L + 1 positions), S step width, H hidden width.

References:
    Neural Temporal Walks: Motif-Aware Representation Learning on Continuous-Time Dynamic
    Graphs, NeurIPS 2022 (Jin, Li, Pan; proceedings pp. 19874-19886; no arXiv version
    found), sections 3.1 (spatiotemporal-biased walks), 3.2 (walk encoding with neural
    ODEs), 3.3 (contrastive loss); reference code KimMeen/Neural-Temporal-Walks
    (`module.py`: `FeatureEncoder`, `GRUODECell`, `WalkEncoder`, `NeurTWs.contrast`;
    `graph.py`: `NeighborFinder.get_temporal_neighbor`; `utils.py`: `get_args`).
    GRU-ODE-Bayes: Continuous modeling of sporadically-observed time series, NeurIPS 2019,
    arXiv 1905.12374 (section 3, the GRU-ODE). The 3/8-rule Runge-Kutta method: Kutta,
    "Beitrag zur naeherungsweisen Integration totaler Differentialgleichungen", 1901.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from functools import partial

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from frugal._typing import I64
from frugal.tgraph.models.cawn import AnonymousWalkModel, WalkEncoder
from frugal.tgraph.models.registry import ModelInputs, register_model
from frugal.tgraph.walks import TemporalWalks

__all__ = ["ContinuousWalkEncoder", "GRUODEFlow", "NeurTW", "build_neurtw", "rk4_integrate"]


def rk4_integrate(
    func: Callable[[Tensor], Tensor], h_WH: Tensor, duration_W1: Tensor, *, step_size: float = 0.125
) -> Tensor:
    """h(duration) of the autonomous ODE dh/dt = func(h), by fixed-step RK4 (3/8 rule).

    As the reference does, time is rescaled to s in [0, 1] (dh/ds = duration * func(h)) and
    integrated in ceil(1 / step_size) equal steps, so each row takes the same number of
    steps whatever its duration. A zero duration returns `h_WH` unchanged.

    Args:
        func: The vector field, (W, H) -> (W, H).
        h_WH: The state at t = 0.
        duration_W1: How long each row flows, >= 0.
        step_size: Step on the unit interval, in (0, 1] (0.125: 8 steps).

    Returns:
        The state after each row's duration.

    Raises:
        ValueError: If step_size is not in (0, 1].

    Shapes:
        h_WH: (W, H); duration_W1: (W, 1) -> (W, H).

    References:
        Kutta's 3/8 rule (1901), torchdiffeq's fixed-grid 'rk4' (`rk4_alt_step_func`),
        which the NeurTW reference code calls with step_size 0.125.
    """
    if not 0 < step_size <= 1:
        raise ValueError(f"step_size={step_size} must lie in (0, 1]; 0.125 gives 8 RK4 steps")
    num_steps = math.ceil(1.0 / step_size - 1e-9)
    dt_W1 = duration_W1 / num_steps
    for _ in range(num_steps):  # one 3/8-rule step each
        k1 = func(h_WH)
        k2 = func(h_WH + dt_W1 * k1 / 3)
        k3 = func(h_WH + dt_W1 * (k2 - k1 / 3))
        k4 = func(h_WH + dt_W1 * (k1 - k2 + k3))
        h_WH = h_WH + dt_W1 * (k1 + 3 * (k2 + k3) + k4) / 8
    return h_WH


class GRUODEFlow(nn.Module):
    """The GRU-ODE vector field dh/dt = (1 - z) * (g - h) (no input between observations).

    z = sigmoid(U_z h), r = sigmoid(U_r h), g = tanh(U_g (r * h)), no biases (De Brouwer et
    al. 2019, eq. 3 with x = 0; NeurTW's `GRUODECell`).

    Shapes:
        forward: h (W, H) -> dh/dt (W, H).
    """

    def __init__(self, hidden_features: int) -> None:
        super().__init__()
        self.gates = nn.Linear(hidden_features, 2 * hidden_features, bias=False)  # U_r, U_z
        self.candidate = nn.Linear(hidden_features, hidden_features, bias=False)  # U_g

    def forward(self, h_WH: Tensor) -> Tensor:
        """dh/dt at h."""
        r_WH, z_WH = torch.sigmoid(self.gates(h_WH)).chunk(2, dim=1)
        g_WH = torch.tanh(self.candidate(r_WH * h_WH))
        return (1 - z_WH) * (g_WH - h_WH)


class ContinuousWalkEncoder(nn.Module):
    """A walk in continuous time: GRU jumps at its steps, GRU-ODE flow over the gaps between.

    From h = 0: for each real position i = 0..len-1, h <- GRUCell(x_i, h), then (if
    position i + 1 is real) h flows for gap_i under `GRUODEFlow` (`rk4_integrate`). The
    output is the state after the last real position, with dropout (NeurTW's
    `FeatureEncoder.integrate`). A `SequenceEncoderFactory` of CAWN's `WalkEncoder`.

    Args:
        in_features: S.
        hidden_features: H.
        step_size: RK4 step on the unit interval.
        dropout: Dropout of the output.

    Shapes:
        forward: x (W, L + 1, S), length (W,) in [1, L + 1], gap (W, L) (0 where position
            i + 1 is null) -> (W, H).
    """

    def __init__(
        self, in_features: int, hidden_features: int, *, step_size: float, dropout: float
    ) -> None:
        super().__init__()
        self.out_features = hidden_features
        self.step_size = step_size
        self.jump = nn.GRUCell(in_features, hidden_features)
        self.flow = GRUODEFlow(hidden_features)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x_WLS: Tensor, length_W: Tensor, gap_WL: Tensor) -> Tensor:
        """The state after each walk's last real position."""
        # Walks with equal inputs (x, length, gaps) get equal states: each distinct one is
        # integrated once and gathered back (13-20 % fewer rows on a small stream).
        # Equal rows of x come from the same pattern row upstream, so the copies' gradients,
        # summed through the one integrated, reach the parameters unchanged.
        key_WX = torch.cat(
            [x_WLS.detach().flatten(1), length_W[:, None].to(x_WLS.dtype), gap_WL], dim=1
        )  # fmt: skip
        _, inverse_W = torch.unique(key_WX, dim=0, return_inverse=True)
        first_U = torch.full((int(inverse_W.max()) + 1,), -1, dtype=torch.long)
        first_U.scatter_reduce_(
            0, inverse_W, torch.arange(len(inverse_W)), "amin", include_self=False
        )
        out: Tensor = self.dropout(
            self._integrate(x_WLS[first_U], length_W[first_U], gap_WL[first_U])[inverse_W]
        )
        return out

    def _integrate(self, x_WLS: Tensor, length_W: Tensor, gap_WL: Tensor) -> Tensor:
        num, positions, _ = x_WLS.shape
        h_WH = x_WLS.new_zeros(num, self.out_features)
        for i in range(positions):  # one jump (and one flow) per walk position
            live_W1 = (length_W > i)[:, None]
            h_WH = torch.where(live_W1, self.jump(x_WLS[:, i], h_WH), h_WH)
            if i + 1 < positions:  # a zero gap (next position null) leaves h as it is
                h_WH = rk4_integrate(
                    self.flow, h_WH, gap_WL[:, i : i + 1], step_size=self.step_size
                )  # fmt: skip
        return h_WH


class NeurTW(AnonymousWalkModel):
    """Neural Temporal Walks link predictor (see the module docstring).

    Implements the pair-model calls of the trainer (`PAIR_MODEL_METHODS`) on
    `PairScoringModel` through CAWN's `AnonymousWalkModel`: it keeps no event state.

    Args:
        num_nodes: N.
        msg: Edge features of every event, (E, F) float32 (F may be 0).
        embedding_dim: D, the output width of each endpoint's walk-set vector.
        num_walks: M walks per node, >= 1.
        walk_length: L steps per walk, >= 1.
        alpha: Time bias of the walk sampler per unit of t, >= 0.
        spatial_bias: Structural (degree) bias of the walk sampler, >= 0 (0: time only).
        pos_dim: Width of the anonymisation encoding, >= 1.
        step_size: RK4 step on the unit interval, in (0, 1].
        dropout: Dropout.

    Raises:
        ValueError: On a setting out of range.
    """

    def __init__(
        self,
        num_nodes: int,
        msg: npt.NDArray[np.float32],
        *,
        embedding_dim: int = 100,
        num_walks: int = 32,
        walk_length: int = 2,
        alpha: float = 1e-5,
        spatial_bias: float = 1.0,
        pos_dim: int = 108,
        step_size: float = 0.125,
        dropout: float = 0.1,
    ) -> None:
        if not 0 < step_size <= 1:
            raise ValueError(f"step_size={step_size} must lie in (0, 1]; 0.125 gives 8 RK4 steps")
        super().__init__(
            num_nodes, msg, num_walks=num_walks, walk_length=walk_length, alpha=alpha,
            pos_dim=pos_dim, spatial_bias=spatial_bias,
        )  # fmt: skip
        self.walk_encoder = WalkEncoder(
            self.edge_width, walk_length, pos_dim, embedding_dim, walk_pool="sum",
            dropout=dropout,
            sequence_encoder=partial(ContinuousWalkEncoder, step_size=step_size, dropout=dropout),
        )  # fmt: skip
        self._build_merge_layer(embedding_dim)

    def _steps(self, walks: TemporalWalks, rows: I64) -> tuple[Tensor, Tensor, Tensor]:
        """Edge features per step (width 0 without them), lengths, normalised time gaps.

        The gap from position i to i + 1 is log10(1 + (t_i - t_(i+1))) + 0.01 (the
        reference's `FeatureEncoder.integrate`), a difference of times only; 0 where
        position i + 1 is null.

        Shapes:
            -> (R M, L + 1, S), (R M,), (R M, L).
        """
        mask = walks.mask[rows]
        t = walks.t[rows]
        real_next = mask[:, :, 1:]
        dt = np.where(real_next, t[:, :, :-1] - t[:, :, 1:], 0).astype(np.float64)
        gap = np.where(real_next, np.log10(1.0 + dt) + 0.01, 0.0).astype(np.float32)
        num = mask.shape[0] * mask.shape[1]
        if self.use_edge_features:
            steps = self._edge_features(walks, rows).reshape(num, mask.shape[2], -1)
        else:
            steps = torch.zeros(num, mask.shape[2], 0)
        length = torch.from_numpy(mask.sum(axis=2).reshape(num))
        return steps, length, torch.from_numpy(gap.reshape(num, -1))


def build_neurtw(inputs: ModelInputs, **options: object) -> NeurTW:
    """The registered `neurtw`: `NeurTW.from_inputs` with the defaults of the module docstring."""
    return NeurTW.from_inputs(inputs, **options)


register_model(
    "neurtw",
    build_neurtw,
    description="NeurTW (NeurIPS 2022): 32 spatio-temporally biased walks of 2 steps, CAW "
    "anonymisation, GRU-ODE walk encoder (RK4, step 0.125), BCE loss (not InfoNCE); "
    "pair-scoring (ranked on the protocol's sampled candidates)",
    native_neighbor_strategy="uniform",
    scoring="pair",
    # Benchtemp's NeurTW script: batches of 32, 30 epochs, tolerance 0.
    training={"benchtemp": {"train_batch_size": 32, "max_epochs": 30, "tolerance": 0.0}},
    in_default=False,  # hours per epoch and evaluation on a CPU: name it with --model
)
