#!/usr/bin/env bash
# The full tgraph sweep: every model on every bundled temporal dataset under both protocols,
# 3 seeds, one torch thread per run. Two queues run side by side (one per protocol, one core
# each). Every (dataset, model, seed) run is journaled in its group's runs.jsonl, so running
# this again resumes where it stopped; commit the group folders to keep the progress.
#
#   make install && benchmarks/tgraph/sweep.sh     # both protocols (hours)
#   PROTOCOLS=frugal benchmarks/tgraph/sweep.sh
#   .venv/bin/frugal tgraph leaderboard benchmarks/tgraph
#
# FRUGAL (the frugal executable) and OUT (the results folder) are relative to the
# repository root. A group that fails is logged and the queue goes on with the next one.
# Stop the sweep with Ctrl-C or `kill <pid of this script>`: both queues stop with it.
set -euo pipefail
cd "$(dirname "$0")/../.."
FRUGAL=${FRUGAL:-.venv/bin/frugal}
OUT=${OUT:-benchmarks/tgraph}
PROTOCOLS=${PROTOCOLS:-frugal benchtemp}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-14400}  # TGAT on sp_primary takes well over an hour a seed

if [ ! -x "$FRUGAL" ]; then
    echo "sweep.sh: $FRUGAL is not an executable; run 'make install' first (or set FRUGAL)" >&2
    exit 2
fi
mkdir -p "$OUT"
exec 9>"$OUT/.sweep.lock"
if ! flock -n 9; then
    echo "sweep.sh: another sweep holds $OUT/.sweep.lock; stop it first" >&2
    exit 2
fi

group() {  # protocol group [frugal tgraph bench options...]; returns the bench's exit code
    local protocol=$1 name=$2 rc=0
    shift 2
    local began=$SECONDS
    local commit
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)  # read at every group
    echo "$(date -u +%FT%TZ) start $protocol/$name at commit $commit"
    "$FRUGAL" tgraph bench --protocol "$protocol" --seeds 3 --set num_threads=1 \
        --set "run_timeout_s=$RUN_TIMEOUT_S" --out "$OUT/$protocol/$name" "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "$(date -u +%FT%TZ) done $protocol/$name in $((SECONDS - began)) s"
    else
        echo "$(date -u +%FT%TZ) FAILED $protocol/$name (exit $rc) after $((SECONDS - began)) s"
    fi
    return "$rc"
}

queue() {  # protocol: its groups in order, cheapest first; a failed group does not stop it
    local protocol=$1 failed=0
    group "$protocol" collegemsg --dataset collegemsg || failed=1
    group "$protocol" sociopatterns --task nc --dataset sp_hospital --dataset sp_highschool \
        --dataset sp_primary --set compare_pyg_reference=false || failed=1
    group "$protocol" pubmed --task nc --dataset pubmed --set compare_pyg_reference=false ||
        failed=1
    group "$protocol" movielens100k --dataset movielens100k --set compare_pyg_reference=false ||
        failed=1
    return "$failed"
}

pids=()
stop() {  # each queue is its own process group: its bench and the bench's runs stop with it
    trap - INT TERM
    for pid in "${pids[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    wait
    exit 130
}
trap stop INT TERM
set -m  # job control: every queue gets a process group of its own
for protocol in $PROTOCOLS; do
    mkdir -p "$OUT/$protocol"
    queue "$protocol" >>"$OUT/$protocol/sweep.log" 2>&1 &
    pids+=($!)
done
set +m
echo "sweep.sh: queues ${pids[*]} for $PROTOCOLS; logs in $OUT/<protocol>/sweep.log"
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
exit $status
