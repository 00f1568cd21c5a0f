#!/usr/bin/env bash
# Replay a trace in several modes back to back on one GPU host; one report.
#   benchmarks/replay_modes.sh OUTDIR TRACE SECONDS CONCURRENCY MODE...
# MODE: native | serial | krex | krex-nolock | ungated | krex-mps, optionally MODE@SECONDS to
# give that mode its own duration. The first native run is the
# reference and a second one is reported as native repeat. A warm-up pass
# (ungated, every command once) fills the compile caches first.
# These modes start every command cold (--warm off) with CONCURRENCY commands per GPU.
# The shipped configuration as a user gets it (krexd's own slots, warm starts, shared
# compile caches), and one lever of it turned back each:
#   shipped | shipped-mps | slots4 (slots_per_gpu = 4) | cold (--warm off) |
#   nocache ([cache] enabled = false, the tools' default caches emptied first)
# native reads the per-user compile cache krex run gives its commands (the warm-up
# filled it), so no mode is favoured by the warm-up.
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
# set SECTION KEY VALUE: the shipped config with one key changed, on stdout
set_key() {
    awk -v sec="[$1]" -v key="$2" -v val="$3" '
        /^\[/ { in_sec = ($0 == sec) }
        in_sec && $1 == key && $2 == "=" { print key " = " val; done = 1; next }
        { print }
        END { if (!done) exit 3 }' etc/krex.toml
}
cache_root=${XDG_CACHE_HOME:-$HOME/.cache}/krex/compile
n=0
for spec in "$@"; do
    n=$((n + 1))
    mode=${spec%@*}
    dur=$secs
    [ "$mode" != "$spec" ] && dur=${spec#*@}
    warm=(--warm off)
    envs=()
    case $mode in
        native) args=(--mode native)
            envs=(TORCHINDUCTOR_CACHE_DIR="$cache_root/inductor" TRITON_CACHE_DIR="$cache_root/triton"
                  CUDA_CACHE_PATH="$cache_root/cuda") ;;
        serial) args=(--mode serial) ;;
        krex) args=(--mode krex --concurrency "$conc") ;;
        ungated) args=(--mode ungated --concurrency "$conc") ;;
        krex-nolock)  # the shim's acknowledgements alone ([region] driver_lock = "off")
            set_key region driver_lock '"off"' >"$out/nolock.toml" || { echo "no driver_lock in etc/krex.toml" >&2; exit 2; }
            args=(--mode krex --concurrency "$conc" --config "$out/nolock.toml") ;;
        krex-mps)
            set_key mps enabled true >"$out/mps.toml" || exit 2
            args=(--mode krex --concurrency "$conc" --config "$out/mps.toml") ;;
        shipped) args=(--mode krex); warm=() ;;
        shipped-mps)
            set_key mps enabled true >"$out/mps.toml" || exit 2
            args=(--mode krex --config "$out/mps.toml"); warm=() ;;
        slots4)
            set_key admission slots_per_gpu 4 >"$out/slots4.toml" || exit 2
            args=(--mode krex --config "$out/slots4.toml"); warm=() ;;
        cold) args=(--mode krex) ;;
        nocache)
            set_key cache enabled false >"$out/nocache.toml" || exit 2
            rm -rf "/tmp/torchinductor_$(id -un)" "$HOME/.triton/cache" "$HOME/.nv/ComputeCache"
            args=(--mode krex --config "$out/nocache.toml"); warm=() ;;
        *) echo "unknown mode $mode" >&2; exit 2 ;;
    esac
    # --warm off (all but the shipped modes): commands start cold, as native's do, so the
    # modes differ in sharing and gating only.
    env ${envs[@]+"${envs[@]}"} python3 -m krex_cli replay "$trace" "${args[@]}" ${warm[@]+"${warm[@]}"} --duration "$dur" --no-progress --no-report \
        --out "$out/$n-$mode" >"$out/$n-$mode.log" 2>&1
    echo "$mode: rc=$? $(wc -l <"$out/$n-$mode/results.jsonl") commands"
done
krex replay report "$out"/[0-9]*-*/ --out "$out/report" >"$out/report.log" 2>&1
echo "report: rc=$?"
