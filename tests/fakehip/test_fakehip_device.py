"""What the simulated GPUs look like through HIP (properties, attributes,
UUIDs, visibility), memory shared with CUDA tenants and what each allocation
holds, HIP's error codes and last error, and the library itself (exports,
soname, ROCm's header)."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from krexd.hardware.inventory import fake_amd_uuid

from .harness import HERE, FakeHip

GIB = 1 << 30


def test_device_properties(fh: FakeHip) -> None:
    info = fh.hipbench("--info", env=fh.env(KREX_FAKE_GPUS="2", KREX_FAKE_MEM_BYTES="64G"))
    assert info["count"] == 2 and info["runtime_version"] == 60200000
    d0, d1 = info["devices"]
    assert d0["name"] == "AMD Instinct MI300X (fake)"
    assert d0["gcnArchName"].startswith("gfx942")
    assert d0["totalGlobalMem"] == 64 * GIB
    assert d0["l2CacheSize"] == d0["attr_l2CacheSize"] == 4 << 20
    assert (d0["warpSize"], d0["multiProcessorCount"], d0["major"], d0["minor"]) == (64, 304, 9, 4)
    # ROCm's form: the 16 hex digits of krexd's name for the GPU (fake_amd_uuid), as text.
    assert d0["uuid"] == d0["uuid_call"] == b"6b72657866616b00".hex()
    assert d1["uuid"] == b"6b72657866616b01".hex()
    assert (d0["pciBusID"], d0["pciBusId"]) == (0x18, "0000:18:00.0")
    # HIP 5's layout (hipDeviceProp_t) carries the same values.
    assert d0["r0000"] == {
        "name": d0["name"],
        "totalGlobalMem": 64 * GIB,
        "l2CacheSize": 4 << 20,
        "gcnArchName": d0["gcnArchName"],
        "pciBusID": 0x18,
    }


def test_uuid_is_krexds_name_of_the_simulated_amd_gpu(fh: FakeHip) -> None:
    """hipDeviceGetUuid's 16 characters, after "GPU-", are the name krexd gives the GPU
    (krexd.hardware.inventory.fake_amd_uuid) and the one ROCR_VISIBLE_DEVICES accepts."""
    info = fh.hipbench("--info", env=fh.env(KREX_FAKE_GPUS="3"))
    names = ["GPU-" + bytes.fromhex(d["uuid"]).decode() for d in info["devices"]]
    assert names == [fake_amd_uuid(i) for i in range(3)]


@pytest.mark.parametrize(
    ("env", "buses"),
    [
        ({}, [0x18, 0x28, 0x38]),
        ({"HIP_VISIBLE_DEVICES": "2,0"}, [0x38, 0x18]),
        ({"CUDA_VISIBLE_DEVICES": "1"}, [0x28]),  # HIP honours it when HIP_VISIBLE_DEVICES is unset
        ({"HIP_VISIBLE_DEVICES": "0", "CUDA_VISIBLE_DEVICES": "2"}, [0x18]),
        ({"ROCR_VISIBLE_DEVICES": "2,1"}, [0x38, 0x28]),
        ({"ROCR_VISIBLE_DEVICES": "2,1", "HIP_VISIBLE_DEVICES": "1"}, [0x28]),  # in turn
        ({"HIP_VISIBLE_DEVICES": "1,7,0"}, [0x28]),  # up to the first invalid entry
        # ROCr's form of krexd's simulated AMD GPUs (krexd.hardware.inventory.fake_amd_uuid), as
        # krex run sets
        ({"ROCR_VISIBLE_DEVICES": "GPU-6b72657866616b02", "HIP_VISIBLE_DEVICES": "0"}, [0x38]),
        ({"HIP_VISIBLE_DEVICES": "GPU-6b72657866616b01,0"}, [0x28, 0x18]),
    ],
)
def test_visible_devices(fh: FakeHip, env: dict[str, str], buses: list[int]) -> None:
    info = fh.hipbench("--info", env=fh.env(KREX_FAKE_GPUS="3", **env))
    assert [d["pciBusID"] for d in info["devices"]] == buses


def test_no_visible_device_is_hip_error_no_device(fh: FakeHip) -> None:
    proc = subprocess.run(
        [str(fh.hip.hipbench), "--info"],
        env=fh.env(HIP_VISIBLE_DEVICES=""),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1 and "hipErrorNoDevice" in proc.stderr


def test_memory_is_shared_with_cuda_tenants(fh: FakeHip) -> None:
    env = fh.env(KREX_FAKE_MEM_BYTES="1G")
    cuda = fh.alloc_proc("alloc=700M", "wait", env=env)
    try:
        assert cuda.stdout is not None and cuda.stdout.readline()
        res = fh.python_json(
            """
import ctypes, json, hipgpu
g = hipgpu.init()
free, total = g.mem_get_info()
p = ctypes.c_void_p()
oom = g.hip.try_call("hipMalloc", ctypes.byref(p), 400 << 20)
ok = g.malloc(200 << 20)
print(json.dumps({"free": free, "total": total, "oom": oom, "name": g.hip.error_name(oom)}))
""",
            env=env,
        )
    finally:
        cuda.kill()
        cuda.wait()
    assert res["total"] == 1 << 30 and res["free"] == (1 << 30) - (700 << 20)
    assert (res["oom"], res["name"]) == (2, "hipErrorOutOfMemory")


def test_pitched_memory_arrays_and_physical_allocations_hold_device_memory(fh: FakeHip) -> None:
    # hipMalloc3D pads rows to 256 bytes; an array holds element x width x height x depth
    # bytes; hipMemCreate is the engine's physical allocation; a second free is refused.
    res = fh.python_json(
        """
import json, hipgpu
g = hipgpu.init()
def used():
    free, total = g.mem_get_info()
    return total - free
base = used()
out = {}
p, out["pitch"] = g.malloc3d(1000, 4, 3)
out["malloc3d"] = used() - base
g.free(p)
for how, free in hipgpu.ARRAY_CALLS.items():
    a = g.array_create(100, 2, 3 if "3D" in how else 0, how=how)
    out[how] = used() - base
    g.array_free(a, free)
    out[how + " again"] = g.hip.try_call(free, a)
h = g.mem_create(1 << 20)
out["memcreate"] = used() - base
g.mem_release(h)
out["release again"] = g.hip.try_call("hipMemRelease", h)
out["after"] = used() - base
print(json.dumps(out))
"""
    )
    assert res["pitch"] == 1024 and res["malloc3d"] == 1024 * 4 * 3
    assert res["hipMallocArray"] == res["hipArrayCreate"] == 16 * 100 * 2
    assert res["hipMalloc3DArray"] == res["hipArray3DCreate"] == 16 * 100 * 2 * 3
    assert res["memcreate"] == 1 << 20 and res["after"] == 0
    again = [v for k, v in res.items() if k.endswith("again")]
    assert again == [1] * 5  # hipErrorInvalidValue


def test_error_codes_names_and_last_error(fh: FakeHip) -> None:
    res = fh.python_json(
        """
import ctypes, json, hipgpu
h = hipgpu.Hip()
out = {}
out["set_device"] = h.try_call("hipSetDevice", 5)
out["peek"] = h.try_call("hipPeekAtLastError")
out["ok_call"] = h.try_call("hipSetDevice", 0)
out["last"] = h.try_call("hipGetLastError")          # the failure, kept past a success
out["after"] = h.try_call("hipGetLastError")         # reset
g = hipgpu.HipGpu(h)
s = g.stream_create()
g.launch(300_000_000, s)
out["not_ready"] = h.try_call("hipStreamQuery", s)
out["last_after_not_ready"] = h.try_call("hipGetLastError")   # not an error
out["bad_free"] = h.try_call("hipFree", ctypes.c_void_p(12345))
out["bad_kind"] = h.try_call("hipMemcpy", ctypes.c_void_p(1), ctypes.c_void_p(2), 8, 9)
out["no_fn"] = h.try_call("hipLaunchKernel", None, hipgpu.Dim3(1, 1, 1), hipgpu.Dim3(1, 1, 1),
                          None, 0, None)
e = g.event_create()
ms = ctypes.c_float()
out["unrecorded"] = h.try_call("hipEventElapsedTime", ctypes.byref(ms), e, e)
out["null_stream_destroy"] = h.try_call("hipStreamDestroy", None)
out["module_file"] = h.try_call("hipModuleLoad", ctypes.byref(ctypes.c_void_p()),
                                b"/nonexistent/kernel.hsaco")
pr = ctypes.c_int()
out["priority"] = [h.try_call("hipStreamGetPriority", g.stream_create(priority=-7),
                              ctypes.byref(pr)), pr.value]
out["names"] = {str(c): [h.error_name(c), h.error_string(c)]
                for c in (0, 1, 2, 101, 400, 600, 700, 4242)}
print(json.dumps(out))
"""
    )
    assert res["set_device"] == 101 and res["peek"] == 101
    assert res["ok_call"] == 0 and res["last"] == 101 and res["after"] == 0
    assert res["not_ready"] == 600 and res["last_after_not_ready"] == 0
    assert res["bad_free"] == 1 and res["bad_kind"] == 21 and res["no_fn"] == 98
    assert res["unrecorded"] == 400 and res["null_stream_destroy"] == 400
    assert res["module_file"] == 301
    assert res["priority"] == [0, -1]  # ROCm's range is 1 (low) .. -1 (high)
    assert res["names"] == {
        "0": ["hipSuccess", "no error"],
        "1": ["hipErrorInvalidValue", "invalid argument"],
        "2": ["hipErrorOutOfMemory", "out of memory"],
        "101": ["hipErrorInvalidDevice", "invalid device ordinal"],
        "400": ["hipErrorInvalidHandle", "invalid resource handle"],
        "600": ["hipErrorNotReady", "device not ready"],
        "700": ["hipErrorIllegalAddress", "an illegal memory access was encountered"],
        "4242": ["hipErrorUnknown", "unknown error"],
    }


def test_fault_is_sticky(fh: FakeHip) -> None:
    proc = fh.hipbench_proc("--fault-after", "2", "--count", "5")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 1
    assert (
        '"error": {"call": "hipLaunchKernel", "code": 700, "name": "hipErrorIllegalAddress"}' in out
    )


def test_loaded_by_name_and_linked_by_rpath(fh: FakeHip) -> None:
    env = fh.env()
    direct = fh.hipbench(
        "--count", "2", env={k: v for k, v in env.items() if k != "LD_LIBRARY_PATH"}
    )
    by_name = fh.hipbench("--link", "dlsym", "--count", "2", env=env)
    for out in (direct, by_name):
        sym = out["symbols"]["hipLaunchKernel"]
        assert (sym["name"], sym["object"]) == ("hipLaunchKernel", "libamdhip64.so.6")
    assert direct["symbols"] == by_name["symbols"]


def test_library_exports_only_hip_and_has_rocm6_soname(fh: FakeHip) -> None:
    lib = fh.hip.lib_dir / "libamdhip64.so.6"
    assert os.readlink(fh.hip.lib_dir / "libamdhip64.so") == "libamdhip64.so.6"
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
    ).stdout
    exports = {line.split()[-1] for line in out.splitlines() if " T " in line}
    assert exports and all(name.startswith("hip") for name in exports), "engine stays local"
    declared = set(re.findall(r"^hipError_t (hip\w+)\(", (HERE / "hip_api.h").read_text(), re.M))
    declared |= {"hipGetErrorName", "hipGetErrorString"}
    assert exports == declared
    dyn = subprocess.run(["readelf", "-d", str(lib)], capture_output=True, text=True).stdout
    assert "Library soname: [libamdhip64.so.6]" in dyn


def test_every_export_makes_the_engines_entry_check_first() -> None:
    # The checkpoint lock's gate (tests/fakecuda/checkpoint.c): a HIP call counts as one
    # driver call in progress, and blocks while its process is locked.
    missing = []
    for path in sorted(HERE.glob("hip_*.c")):
        text = path.read_text()
        for m in re.finditer(r"^FH_API [^;{]*?(\w+)\([^{;]*\)\s*\{\n(.*)\n", text, re.M):
            if m.group(2).strip() != "FC_ENTRY();":
                missing.append(f"{path.name}: {m.group(1)}")
    assert not missing
    assert len(re.findall(r"^FH_API ", "".join(p.read_text() for p in HERE.glob("*.c")), re.M)) > 70


@pytest.mark.skipif(
    not Path("/usr/include/hip/hip_runtime_api.h").exists(),
    reason="ROCm's hip_runtime_api.h is not installed (Debian: libamdhip64-dev)",
)
def test_declarations_match_rocm_header(fakehip_build: object) -> None:
    # Every source compiled against ROCm's header; hip_api.h's values asserted against it.
    subprocess.run(
        ["make", "-s", "-B", "-C", str(HERE), "check-headers"],
        check=True,
        stdout=subprocess.DEVNULL,
        timeout=300,
    )
