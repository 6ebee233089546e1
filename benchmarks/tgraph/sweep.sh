#!/usr/bin/env bash
# The full tgraph sweep: every model on every bundled temporal dataset under both protocols,
# SEEDS (3) seeds, one torch thread per run. WORKERS (2) benches run side by side, one core
# each; they share the (protocol, group, seed) tasks, cheapest group first, each taken by one
# worker, so a core that finishes early takes the next seed of any group: one group's slow
# model (TGAT) runs its seeds on both cores. The worker that ends a group's last seed writes
# the group's results.json over all its seeds (a bench that resumes every run).
# Every (dataset, model, seed) run is journaled in its group's runs.jsonl, so running this
# again resumes where it stopped; commit the group folders to keep the progress.
#
#   make install && benchmarks/tgraph/sweep.sh     # both protocols (hours)
#   PROTOCOLS=frugal benchmarks/tgraph/sweep.sh
#   MODELS="nat cawn" benchmarks/tgraph/sweep.sh  # these models only (default: the bench's
#                                                 # default set, all but cawn/dygformer/neurtw)
#   .venv/bin/frugal tgraph leaderboard benchmarks/tgraph
#
# FRUGAL (the frugal executable) and OUT (the results folder) are relative to the
# repository root. A seed that fails is logged and its worker goes on with the next task.
# Stop the sweep with Ctrl-C or `kill <pid of this script>`: every worker stops with it.
set -euo pipefail
cd "$(dirname "$0")/../.."
FRUGAL=${FRUGAL:-.venv/bin/frugal}
OUT=${OUT:-benchmarks/tgraph}
PROTOCOLS=${PROTOCOLS:-frugal benchtemp}
RUN_TIMEOUT_S=${RUN_TIMEOUT_S:-14400}  # TGAT on sp_primary takes well over an hour a seed
WORKERS=${WORKERS:-2}  # benches at a time, one core each
SEEDS=${SEEDS:-3}  # seeds 0 .. SEEDS-1 of every learned model (heuristics run once)
MODELS=${MODELS:-}  # space-separated model names; empty = the bench's default model set
if ! [[ $WORKERS =~ ^[1-9][0-9]*$ ]]; then
    echo "sweep.sh: WORKERS=$WORKERS must be a positive integer (one bench per core)" >&2
    exit 2
fi
if ! [[ $SEEDS =~ ^[1-9][0-9]{0,2}$ ]]; then
    echo "sweep.sh: SEEDS=$SEEDS must be an integer from 1 to 999 (seeds per model)" >&2
    exit 2
fi
if ! [[ $RUN_TIMEOUT_S =~ ^[1-9][0-9]*$ ]]; then
    echo "sweep.sh: RUN_TIMEOUT_S=$RUN_TIMEOUT_S must be a positive whole number of seconds" >&2
    exit 2
fi
for protocol in $PROTOCOLS; do
    if [ "$protocol" != frugal ] && [ "$protocol" != benchtemp ]; then
        echo "sweep.sh: PROTOCOLS names '$protocol'; each must be frugal or benchtemp" >&2
        exit 2
    fi
done

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

bench() {  # protocol group what [frugal tgraph bench options...]; returns the bench's exit code
    local protocol=$1 name=$2 what=$3 rc=0
    shift 3
    local began=$SECONDS
    local commit
    commit=$(git rev-parse --short HEAD 2>/dev/null || echo unknown)  # read at every bench
    echo "$(date -u +%FT%TZ) start $protocol/$name $what at commit $commit"
    "$FRUGAL" tgraph bench --protocol "$protocol" --set num_threads=1 \
        --set "run_timeout_s=$RUN_TIMEOUT_S" --out "$OUT/$protocol/$name" "$@" || rc=$?
    if [ "$rc" -eq 0 ]; then
        echo "$(date -u +%FT%TZ) done $protocol/$name $what in $((SECONDS - began)) s"
    else
        echo "$(date -u +%FT%TZ) FAILED $protocol/$name $what (exit $rc) after" \
            "$((SECONDS - began)) s"
    fi
    return "$rc"
}

GROUPS_ORDER=(collegemsg sociopatterns pubmed movielens100k)  # cheapest first
model_options() {  # --model NAME for each of MODELS (none: the bench's default set)
    local model
    for model in $MODELS; do
        printf -- '--model %s ' "$model"
    done
}
group_options() {  # name: the bench options of one group (with MODELS' --model options)
    model_options
    case $1 in
        collegemsg) echo "--dataset collegemsg" ;;
        sociopatterns) echo "--task nc --dataset sp_hospital --dataset sp_highschool" \
            "--dataset sp_primary --set compare_pyg_reference=false" ;;
        pubmed) echo "--task nc --dataset pubmed --set compare_pyg_reference=false" ;;
        movielens100k) echo "--dataset movielens100k --set compare_pyg_reference=false" ;;
        *) echo "sweep.sh: unknown group $1" >&2; return 2 ;;
    esac
}

# Benchtemp's split is not defined on PubMed: its time quantiles 0.70 and 0.85 both fall on
# the year 2008 (22 % of the events), so its val split (val_time < t <= test_time) is empty.
UNDEFINED="benchtemp pubmed"
undefined_reason="Benchtemp's time quantiles 0.70/0.85 both fall on the year 2008, so its val split is empty (frugal/pubmed covers PubMed)"
tasks=()  # (protocol, group, seed), group-major: a worker's next task is the cheapest left
for name in "${GROUPS_ORDER[@]}"; do
    for protocol in $PROTOCOLS; do
        if [ "$protocol $name" != "$UNDEFINED" ]; then
            for ((seed = 0; seed < SEEDS; seed++)); do
                tasks+=("$protocol $name $seed")
            done
        fi
    done
done

claims=$(mktemp -d)  # one directory per task a worker took (mkdir is atomic)
trap 'rm -rf "$claims"' EXIT

collect() {  # protocol group: results.json over every seed, once all seeds of it are done
    local protocol=$1 name=$2 seed
    for ((seed = 0; seed < SEEDS; seed++)); do
        [ -e "$claims/done-$protocol-$name-$seed" ] || return 0  # a seed still runs, or failed
    done
    mkdir "$claims/collect-$protocol-$name" 2>/dev/null || return 0  # another worker does it
    # shellcheck disable=SC2046  # group_options' words are separate options
    bench "$protocol" "$name" "results of seeds 0-$((SEEDS - 1))" --seeds "$SEEDS" \
        $(group_options "$name")
}

worker() {  # id: walks the task list and runs every task no other worker has taken
    local id=$1 failed=0 task protocol name seed rest
    for task in "${tasks[@]}"; do
        read -r protocol name seed <<<"$task"
        if mkdir "$claims/$protocol-$name-$seed" 2>/dev/null; then
            echo "$(date -u +%FT%TZ) worker $id takes $protocol/$name seed $seed" \
                >>"$OUT/$protocol/sweep.log"
            rest=()
            if [ "$seed" -gt 0 ]; then  # PyG's reference TGN is timed once, by seed 0's bench
                rest=(--set compare_pyg_reference=false)
            fi
            # shellcheck disable=SC2046  # group_options' words are separate options
            if bench "$protocol" "$name" "seed $seed" --seeds 1 --first-seed "$seed" \
                $(group_options "$name") "${rest[@]}" >>"$OUT/$protocol/sweep.log" 2>&1; then
                touch "$claims/done-$protocol-$name-$seed"
                collect "$protocol" "$name" >>"$OUT/$protocol/sweep.log" 2>&1 || failed=1
            else
                failed=1
            fi
        fi
    done
    return "$failed"
}

pids=()
stop() {  # each worker is its own process group: its bench and the bench's runs stop with it
    trap - INT TERM
    for pid in "${pids[@]}"; do
        kill -TERM -- "-$pid" 2>/dev/null || true
    done
    wait
    exit 130
}
trap stop INT TERM
for protocol in $PROTOCOLS; do
    mkdir -p "$OUT/$protocol"
    if [ "$protocol" = "${UNDEFINED%% *}" ]; then
        echo "$(date -u +%FT%TZ) not run: $protocol/${UNDEFINED#* }: $undefined_reason" \
            >>"$OUT/$protocol/sweep.log"
    fi
done
set -m  # job control: every worker gets a process group of its own
for ((id = 1; id <= WORKERS; id++)); do
    worker "$id" &
    pids+=($!)
done
set +m
echo "sweep.sh: workers ${pids[*]} share the seeds of every group of $PROTOCOLS; logs in" \
    "$OUT/<protocol>/sweep.log"
status=0
for pid in "${pids[@]}"; do
    wait "$pid" || status=1
done
exit $status
