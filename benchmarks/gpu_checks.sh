#!/usr/bin/env bash
# GPU checks on a host with an NVIDIA GPU, as root: build, run the GPU tests,
# the shim overhead and region latency benchmarks; results into OUTDIR.
#   benchmarks/gpu_checks.sh OUTDIR [pytest -k expression]
# Python packages missing on the host can be put on PYTHONPATH beforehand.
set -uo pipefail
out=${1:?usage: gpu_checks.sh OUTDIR [pytest -k expr]}
sel=${2:-}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD:$PWD/python_client${PYTHONPATH:+:$PYTHONPATH}"
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
make -j8 all >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
python3 -m pytest tests/gpu -p no:cacheprovider -q -s -x ${sel:+-k "$sel"} 2>&1 | tee "$out/gpu-tests.log"
