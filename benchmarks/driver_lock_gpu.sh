#!/usr/bin/env bash
# The driver lock on a real GPU (issue "Exclusivity", item 8), as root from the
# repository root; figures into OUTDIR:
#   benchmarks/driver_lock_gpu.sh OUTDIR [PART...]
# PART (default: all, in this order):
#   attacks  tests/gpu/test_gpu_attacks.py: each attack under the device-clock proof
#            (attacks.jsonl: one row per scene)
#   proof    the honest device-clock proof (test_gpu_regions.py), gated and ungated
#   latency  region entry p50/p99 with 1, 7 and 15 light siblings, driver lock
#            "auto" and "off" alternating, ROUNDS rounds (default 2; lat-<lock>-<round>.json); with
#            OLD=DIR (an older tree, built here) that tree too (lat-old-<round>.json)
#   flood    benchmarks/status_flood.py: another user's status flood vs region entry
#            (simulated GPU: krexd's control plane on this host's cores)
#   replay   krex replay of workloads/trace-h200.jsonl, krex then krex-nolock
#            (REPLAY_S seconds each, default 90; concurrency 12)
# Python packages missing on the host can be put on PYTHONPATH beforehand.
set -uo pipefail
out=${1:?usage: driver_lock_gpu.sh OUTDIR [PART...]}; shift
parts=${*:-attacks proof latency replay}
mkdir -p "$out"; out=$(cd "$out" && pwd)
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/python_client${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
make -j16 all >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
lat() {  # TREE LABEL ROUND [ARGS...]
    local tree=$1 label=$2 round=$3; shift 3
    (cd "$tree" && PYTHONPATH="$PWD:$PWD/python_client:${PYTHONPATH}" timeout -s KILL 300 \
        python3 benchmarks/region_latency.py --sibling light --fake-gpus 0 --siblings 1,7,15 \
        --regions 60 --json "$out/lat-$label-$round.json" "$@" >"$out/lat-$label-$round.log" 2>&1)
    echo "latency $label round $round: rc=$?"; sed -n '1,4p' "$out/lat-$label-$round.log"
}
for part in $parts; do
    case $part in
    attacks)
        rm -f "$out/attacks.jsonl"
        KREX_GPU_ATTACKS_OUT="$out/attacks.jsonl" timeout -s KILL 500 python3 -m pytest \
            tests/gpu/test_gpu_attacks.py -p no:cacheprovider -q -s --timeout=120 >"$out/attacks.log" 2>&1
        echo "attacks: rc=$?"; grep -E "passed|failed" "$out/attacks.log" | tail -3
        python3 - "$out/attacks.jsonl" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    r = json.loads(line)
    print(f"{r['scene']:>18} rc={r['attacker_rc']} ended={r['ended']} kernels={r['attacker_kernels']}"
          f" in-region={r['attacker_overlaps']} sibling={r['sibling_kernels']}/{r['sibling_overlaps']}")
PY
        ;;
    proof)
        timeout -s KILL 400 python3 -m pytest tests/gpu/test_gpu_regions.py -k no_sibling --timeout=200 \
            -p no:cacheprovider -q -s >"$out/proof.log" 2>&1
        echo "proof: rc=$?"; grep -E "enforce=|passed|failed" "$out/proof.log" | tail -4 ;;
    latency)
        if [ -n "${OLD:-}" ]; then (cd "$OLD" && make -j16 all >"$out/build-old.log" 2>&1) || echo "old tree: build failed"; fi
        for round in $(seq 1 "${ROUNDS:-2}"); do
            lat . auto "$round"; lat . off "$round" --driver-lock off
            [ -n "${OLD:-}" ] && lat "$OLD" old "$round"
        done ;;
    flood)
        timeout -s KILL 300 python3 benchmarks/status_flood.py --regions 300 --sockets 32 \
            --json "$out/flood.json" >"$out/flood.log" 2>&1
        echo "flood: rc=$?"; tail -6 "$out/flood.log" ;;
    replay)
        timeout -s KILL 500 benchmarks/replay_modes.sh "$out/replay" workloads/trace-h200.jsonl \
            "${REPLAY_S:-90}" 12 krex krex-nolock ;;
    *) echo "unknown part $part" >&2 ;;
    esac
done
