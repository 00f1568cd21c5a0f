"""Device memory: a per-GPU capacity shared by processes, returned on free
and at exit, reclaimed from killed processes; copies and memsets move data."""

from __future__ import annotations

import signal

from .harness import FakeCuda, read_step, run_steps

GiB = 1 << 30
MiB = 1 << 20
OUT_OF_MEMORY = 2


def test_capacity_is_shared_and_returned_at_exit(fc: FakeCuda) -> None:
    env = fc.env(KREX_FAKE_MEM_BYTES="1G")
    holder = fc.alloc_proc("alloc=700M", "wait", env=env)
    assert read_step(holder)["rc"] == 0
    assert read_step(holder) == {"op": "wait"}

    info, denied = run_steps_env(fc, env, "info", "alloc=700M")
    assert (info["total"], info["free"]) == (GiB, GiB - 700 * MiB)
    assert denied["rc"] == OUT_OF_MEMORY

    holder.communicate("\n", timeout=30)  # let it exit normally, without freeing
    assert holder.returncode == 0
    info, granted = run_steps_env(fc, env, "info", "alloc=700M")
    assert info["free"] == GiB
    assert granted["rc"] == 0


def run_steps_env(fc: FakeCuda, env: dict[str, str], *steps: str) -> list[dict[str, object]]:
    proc = fc.alloc_proc(*steps, env=env)
    out = [read_step(proc) for _ in steps]
    proc.wait(timeout=30)
    return out


def test_memory_of_a_killed_process_is_reclaimed(fc: FakeCuda) -> None:
    env = fc.env(KREX_FAKE_MEM_BYTES="1G")
    victim = fc.alloc_proc("alloc=900M", "kill", env=env)
    assert read_step(victim)["rc"] == 0
    assert victim.wait(timeout=30) == -signal.SIGKILL
    [granted] = run_steps_env(fc, env, "alloc=900M")
    assert granted["rc"] == 0


def test_free_returns_memory_within_a_process(fc: FakeCuda) -> None:
    env = fc.env(KREX_FAKE_MEM_BYTES="1G")
    steps = run_steps_env(fc, env, "alloc=600M", "alloc=600M", "free=0", "alloc=600M", "info")
    assert [s["rc"] for s in steps[:2]] == [0, OUT_OF_MEMORY]
    assert steps[3]["rc"] == 0
    assert steps[4]["free"] == GiB - 600 * MiB


def test_each_gpu_has_its_own_capacity(fc: FakeCuda) -> None:
    base = {"KREX_FAKE_MEM_BYTES": "1G", "KREX_FAKE_GPUS": "2"}
    gpu1 = fc.alloc_proc("device=1", "alloc=900M", "wait", env=fc.env(**base))
    assert [read_step(gpu1)["rc"] for _ in range(2)] == [0, 0]
    # GPU 0 is still empty; GPU 1, seen as the only device through CUDA_VISIBLE_DEVICES, is full.
    [on0] = run_steps_env(fc, fc.env(**base), "alloc=900M")
    [on1] = run_steps_env(fc, fc.env(CUDA_VISIBLE_DEVICES="1", **base), "alloc=900M")
    assert (on0["rc"], on1["rc"]) == (0, OUT_OF_MEMORY)
    gpu1.communicate("\n", timeout=30)


def test_fakealloc_script(fc: FakeCuda) -> None:
    steps = run_steps(fc, ["alloc=1M", "free=all", "info"])
    assert [s["op"] for s in steps] == ["alloc", "free", "info"]
    assert steps[2]["free"] == steps[2]["total"] == 80 * GiB


def test_copies_and_memsets_move_data_and_take_modelled_time(fc: FakeCuda) -> None:
    res = fc.python_json(
        """
import json, fakegpu
g = fakegpu.init()
p = g.alloc(1 << 20)
g.to_device(p, b"krex" * 1024)
a = g.from_device(p, 8)
g.memset(p + 4, 0x5A, 4)
b = g.from_device(p, 12)
g.memset(p, 0, 1 << 20)
c = g.from_device(p + 4096, 4)
try:
    g.from_device(p + (1 << 20) - 2, 4)       # runs past the allocation
    bad = 0
except fakegpu.CudaError as e:
    bad = e.code
print(json.dumps([a.hex(), b.hex(), c.hex(), bad]))
"""
    )
    assert res == [b"krexkrex".hex(), (b"krex" + b"\x5a" * 4 + b"krex").hex(), "00000000", 1]
    kinds = [(r.kind, r.duration_ns) for r in fc.records()]
    # 4 KiB over the 50 GB/s host link; 1 MiB memset at 1 TB/s; 8 and 12 bytes back.
    assert kinds == [("C", 82), ("C", 1), ("S", 1), ("C", 1), ("S", 1049), ("C", 1)]


def test_sync_copy_waits_for_earlier_work(fc: FakeCuda) -> None:
    t = fc.python_json(
        """
import json, time, fakegpu
g = fakegpu.init()
p = g.alloc(64)
g.launch(100_000_000)
g.from_device(p, 64)
print(json.dumps(time.monotonic_ns()))
"""
    )
    kernel, copy = fc.records()
    assert copy.start_ns == kernel.end_ns
    assert t >= copy.end_ns


def test_bad_capacity_is_a_clear_cuinit_error(fc: FakeCuda) -> None:
    proc = fc.python("import fakegpu\nfakegpu.init()", env=fc.env(KREX_FAKE_MEM_BYTES="lots"))
    assert proc.returncode != 0
    assert "KREX_FAKE_MEM_BYTES=lots" in proc.stderr
    assert "CUDA_ERROR_INVALID_VALUE" in proc.stderr


def test_pointer_attributes_and_context_teardown(fc: FakeCuda) -> None:
    res = fc.python_json(
        """
import ctypes, json, fakegpu
g = fakegpu.init()
p = g.alloc(700 << 20)
ctx, start, size = ctypes.c_void_p(), ctypes.c_uint64(), ctypes.c_size_t()
d = g.drv
d.call("cuPointerGetAttribute", ctypes.byref(ctx), 1, p + 10)      # CONTEXT
d.call("cuPointerGetAttribute", ctypes.byref(start), 11, p + 10)   # RANGE_START_ADDR
d.call("cuPointerGetAttribute", ctypes.byref(size), 12, p + 10)    # RANGE_SIZE
res = [ctx.value == g.ctx.value, start.value == p, size.value]
g.close()                                   # last release: the context's memory goes
res.append(d.try_call("cuPointerGetAttribute", ctypes.byref(ctx), 1, p))
g2 = fakegpu.FakeGpu()
res.append(g2.mem_info()[0])
print(json.dumps(res))
""",
        env=fc.env(KREX_FAKE_MEM_BYTES="1G"),
    )
    assert res == [True, True, 700 * MiB, 1, GiB]
