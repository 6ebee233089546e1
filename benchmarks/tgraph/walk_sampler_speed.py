"""CAWN's walk sampler on CollegeMsg: vectorised `sample_walks` against the per-walk loop.

Both draw M walks of L steps backwards in time from the two endpoints of B test events
(P ~ exp(alpha dt), alpha 1e-5 per second), with the same uniform numbers, and must return
identical walks. Prints the median seconds of each (3 runs after a warm-up; the loop runs
once) and the speed-up. Run:

    OMP_NUM_THREADS=1 python benchmarks/tgraph/walk_sampler_speed.py [--walks 32] [--queries 400]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from frugal.data import load_events
from frugal.tgraph.neighbors import NeighborFinder
from frugal.tgraph.walks import sample_walks, sample_walks_loop


def main() -> None:
    """Time both samplers and check that they agree."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--walks", type=int, default=32, help="M walks per node")
    parser.add_argument("--length", type=int, default=2, help="L steps per walk")
    parser.add_argument("--queries", type=int, default=400, help="query nodes (2 per event)")
    parser.add_argument("--alpha", type=float, default=1e-5, help="recency bias per second")
    args = parser.parse_args()
    events = load_events("collegemsg")
    first = int(0.85 * events.num_events)  # the start of the test period
    ids = np.arange(first, first + args.queries // 2)
    node = np.concatenate([events.src[ids], events.dst[ids]])
    t = np.concatenate([events.t[ids], events.t[ids]])
    bound = np.full(len(node), first, dtype=np.int64)  # a batch starting at the test cut
    options = {"num_walks": args.walks, "walk_length": args.length, "alpha": args.alpha}
    began = time.perf_counter()
    finder = NeighborFinder(events.src, events.dst, events.t, events.num_nodes)
    finder.sample_time_biased(node[:1], bound[:1], 1, alpha=args.alpha, rng=np.random.default_rng())
    setup_s = time.perf_counter() - began  # CSR and the per-node log-sums (once per finder)
    times = []
    for _ in range(4):  # a warm-up, then 3 timed runs
        began = time.perf_counter()
        fast = sample_walks(finder, node, t, bound, rng=np.random.default_rng(0), **options)  # type: ignore[arg-type]
        times.append(time.perf_counter() - began)
    began = time.perf_counter()
    slow = sample_walks_loop(
        events.src, events.dst, events.t, node, t, bound, rng=np.random.default_rng(0), **options  # type: ignore[arg-type]
    )  # fmt: skip
    loop_s = time.perf_counter() - began
    same = all(
        np.array_equal(getattr(fast, k), getattr(slow, k)) for k in ("node", "eid", "t", "mask")
    )
    fast_s = float(np.median(times[1:]))
    print(
        f"CollegeMsg, {len(node)} queries x {args.walks} walks x {args.length} steps: "
        f"vectorised {fast_s * 1e3:.1f} ms (finder setup {setup_s * 1e3:.0f} ms, once), "
        f"per-walk loop {loop_s * 1e3:.0f} ms, speed-up {loop_s / fast_s:.0f}x, "
        f"identical walks: {same}"
    )


if __name__ == "__main__":
    main()
