#!/usr/bin/env bash
# Replay a trace in several modes back to back on one GPU host; one report.
#   benchmarks/replay_modes.sh OUTDIR TRACE SECONDS CONCURRENCY MODE...
# MODE: native | serial | krex | krex-nolock | ungated | krex-mps, optionally MODE@SECONDS to
# give that mode its own duration. The first native run is the
# reference and a second one is reported as native repeat. A warm-up pass
# (ungated, every command once) fills the compile caches first.
set -uo pipefail
out=${1:?}; trace=${2:?}; secs=${3:?}; conc=${4:?}; shift 4
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/python_client${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
krex() { python3 -m krex_cli "$@"; }
mkdir -p "$out"
if [ "${WARMUP:-1}" != 0 ]; then  # WARMUP=0: the caches are already filled on this host
    krex replay "$trace" --mode ungated --concurrency "$conc" --repeat 1 --no-progress \
        --warm off --no-report --out "$out/warmup" >"$out/warmup.log" 2>&1
    rm -rf "$out/warmup"  # not a measurement
fi
n=0
for spec in "$@"; do
    n=$((n + 1))
    mode=${spec%@*}
    dur=$secs
    [ "$mode" != "$spec" ] && dur=${spec#*@}
    case $mode in
        native) args=(--mode native) ;;
        serial) args=(--mode serial) ;;
        krex) args=(--mode krex --concurrency "$conc") ;;
        ungated) args=(--mode ungated --concurrency "$conc") ;;
        krex-nolock)  # the shim's acknowledgements alone ([region] driver_lock = "off")
            sed 's/^driver_lock = "auto"$/driver_lock = "off"/' etc/krex.toml >"$out/nolock.toml"
            grep -q '^driver_lock = "off"$' "$out/nolock.toml" || { echo "no driver_lock in etc/krex.toml" >&2; exit 2; }
            args=(--mode krex --concurrency "$conc" --config "$out/nolock.toml") ;;
        krex-mps)
            sed 's/^enabled = false$/enabled = true/' etc/krex.toml >"$out/mps.toml"
            args=(--mode krex --concurrency "$conc" --config "$out/mps.toml") ;;
        *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    # --warm off: every mode starts its commands cold (as native does), so the modes
    # differ in sharing and gating only (krex replay's default follows krexd's [warm] start).
    krex replay "$trace" "${args[@]}" --warm off --duration "$dur" --no-progress --no-report \
        --out "$out/$n-$mode" >"$out/$n-$mode.log" 2>&1
    echo "$mode: rc=$? $(wc -l <"$out/$n-$mode/results.jsonl") commands"
done
krex replay report "$out"/[0-9]*-*/ --out "$out/report" >"$out/report.log" 2>&1
echo "report: rc=$?"
