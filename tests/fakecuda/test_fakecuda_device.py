"""Initialization, configuration from the environment, devices and contexts."""

from __future__ import annotations

from krexd.hardware.inventory import fake_uuid

from .harness import FakeCuda

INVALID_CONTEXT = 201
CONTEXT_IS_DESTROYED = 709
NOT_INITIALIZED = 3
NO_DEVICE = 100

PROBE = """
import ctypes, json, fakegpu
d = fakegpu.Driver()
out = {"before": d.try_call("cuDeviceGetCount", ctypes.byref(ctypes.c_int())),
       "init": d.try_call("cuInit", 0)}
v, n = ctypes.c_int(), ctypes.c_int()
d.try_call("cuDriverGetVersion", ctypes.byref(v))
d.try_call("cuDeviceGetCount", ctypes.byref(n))
out["version"], out["count"], out["uuid_last"], out["l2"], out["cc"] = v.value, n.value, [], 0, []
for i in range(n.value):
    u = ctypes.create_string_buffer(16)
    d.call("cuDeviceGetUuid_v2", u, i)
    out["uuid_last"].append(u.raw[15])
if n.value:
    a = ctypes.c_int()
    d.call("cuDeviceGetAttribute", ctypes.byref(a), 38, 0)   # L2_CACHE_SIZE
    out["l2"] = a.value
    for attr in (75, 76):                                    # compute capability
        d.call("cuDeviceGetAttribute", ctypes.byref(a), attr, 0)
        out["cc"].append(a.value)
print(json.dumps(out))
"""


def test_devices_and_properties(fc: FakeCuda) -> None:
    out = fc.python_json(PROBE, env=fc.env(KREX_FAKE_GPUS="3", CUDA_VISIBLE_DEVICES="2,0"))
    assert out["before"] == NOT_INITIALIZED
    assert out["init"] == 0
    assert out["version"] == 13000
    assert out["count"] == 2 and out["uuid_last"] == [2, 0]
    assert out["l2"] == 50 * 1024 * 1024
    assert out["cc"] == [9, 0]


def test_visible_devices_parsing(fc: FakeCuda) -> None:
    cases = {"1,x,0": [1], "": [], "5": [], "0,0": [0]}
    for visible, want in cases.items():
        out = fc.python_json(PROBE, env=fc.env(KREX_FAKE_GPUS="2", CUDA_VISIBLE_DEVICES=visible))
        assert out["uuid_last"] == want, visible
        assert out["init"] == (0 if want else NO_DEVICE)


def test_visible_devices_by_uuid(fc: FakeCuda) -> None:
    """UUID entries (krexd binds tenants by UUID), a unique prefix included, as the driver."""
    g1, g2 = fake_uuid(1), fake_uuid(2)
    cases = {g2: [2], f"{g1},0": [1, 0], g2.upper(): [2], "GPU-6b726578": [], f"{g1}x": []}
    for visible, want in cases.items():
        out = fc.python_json(PROBE, env=fc.env(KREX_FAKE_GPUS="3", CUDA_VISIBLE_DEVICES=visible))
        assert out["uuid_last"] == want, visible


def test_bad_gpu_count(fc: FakeCuda) -> None:
    proc = fc.python(PROBE, env=fc.env(KREX_FAKE_GPUS="17"))
    assert proc.returncode == 0 and '"init": 1' in proc.stdout
    assert "KREX_FAKE_GPUS=17" in proc.stderr


def test_context_stack_and_destroyed_contexts(fc: FakeCuda) -> None:
    out = fc.python_json(
        """
import ctypes, json, fakegpu
g = fakegpu.init()
d = g.drv
cur = lambda: (d.call("cuCtxGetCurrent", ctypes.byref(c := ctypes.c_void_p())), c.value)[1]
ctx = ctypes.c_void_p()
d.call("cuCtxCreate_v4", ctypes.byref(ctx), None, 0, 0)     # created and pushed
res = {"pushed": cur() == ctx.value}
popped = ctypes.c_void_p()
d.call("cuCtxPopCurrent_v2", ctypes.byref(popped))
res["popped"] = popped.value == ctx.value and cur() == g.ctx.value
d.call("cuCtxPushCurrent_v2", ctx)
d.call("cuCtxDestroy_v2", ctx)                              # also pops it
res["after_destroy"] = cur() == g.ctx.value
res["stale"] = d.try_call("cuCtxSynchronize_v2", ctx)
d.call("cuCtxSetCurrent", None)
res["empty"] = d.try_call("cuCtxSynchronize")
flags, active = ctypes.c_uint(), ctypes.c_int()
d.call("cuDevicePrimaryCtxGetState", 0, ctypes.byref(flags), ctypes.byref(active))
res["primary_active"] = active.value
g.close()
d.call("cuDevicePrimaryCtxGetState", 0, ctypes.byref(flags), ctypes.byref(active))
res["primary_released"] = active.value
print(json.dumps(res))
"""
    )
    assert out == {
        "pushed": True,
        "popped": True,
        "after_destroy": True,
        "stale": CONTEXT_IS_DESTROYED,
        "empty": INVALID_CONTEXT,
        "primary_active": 1,
        "primary_released": 0,
    }


def test_forked_child_cannot_use_the_parent_driver(fc: FakeCuda) -> None:
    out = fc.python_json(
        """
import json, os, fakegpu
g = fakegpu.init()
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.write(w, str(g.drv.try_call("cuCtxSynchronize")).encode())
    os._exit(0)
os.waitpid(pid, 0)
print(json.dumps({"child": int(os.read(r, 16)), "parent": g.drv.try_call("cuCtxSynchronize")}))
"""
    )
    assert out == {"child": NOT_INITIALIZED, "parent": 0}
