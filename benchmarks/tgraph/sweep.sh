#!/usr/bin/env bash
# The full tgraph sweep: every model on every bundled temporal dataset under both protocols,
# 3 seeds, one torch thread per run. Two queues run side by side (one per protocol, one core
# each). Every (dataset, model, seed) run is journaled in its group's runs.jsonl, so running
# this again resumes where it stopped; commit the group folders to keep the progress.
#
#   benchmarks/tgraph/sweep.sh              # both protocols, in the background of a session
#   PROTOCOLS=frugal benchmarks/tgraph/sweep.sh
#   .venv/bin/frugal tgraph leaderboard benchmarks/tgraph   # tables, plots, compute time
set -euo pipefail
cd "$(dirname "$0")/../.."
FRUGAL=${FRUGAL:-.venv/bin/frugal}
OUT=${OUT:-benchmarks/tgraph}
PROTOCOLS=${PROTOCOLS:-frugal benchtemp}

group() {  # protocol group [frugal tgraph bench options...]
    local protocol=$1 name=$2
    shift 2
    local began=$SECONDS
    echo "$(date -u +%FT%TZ) start $protocol/$name"
    "$FRUGAL" tgraph bench --protocol "$protocol" --seeds 3 --set num_threads=1 \
        --out "$OUT/$protocol/$name" "$@"
    echo "$(date -u +%FT%TZ) done $protocol/$name in $((SECONDS - began)) s"
}

queue() {  # protocol: its groups in order, cheapest first
    local protocol=$1
    group "$protocol" collegemsg --dataset collegemsg
    group "$protocol" sociopatterns --task nc --dataset sp_hospital --dataset sp_highschool \
        --dataset sp_primary --set compare_pyg_reference=false
    group "$protocol" pubmed --task nc --dataset pubmed --set compare_pyg_reference=false
    group "$protocol" movielens100k --dataset movielens100k --set compare_pyg_reference=false
}

pids=()
for protocol in $PROTOCOLS; do
    mkdir -p "$OUT/$protocol"
    queue "$protocol" >>"$OUT/$protocol/sweep.log" 2>&1 &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
exit $status
