"""The compute-bound clock warm-up (krex_client.warmup_matmul) without a GPU.

A fake torch (tests/client/warmfakes.py) queues each matmul's device time
and runs it at the stream's synchronization, on a fake GPU whose SM clock
warms after some work; the fake NVML reads that clock.  The loop's slices,
stops and budget are exact over the fake time.  The region-level tests use
the fake control connection and a stand-in shim whose launch counter the
fake matmuls advance, as the real shim's hooks would.  On a real GPU:
tests/gpu/test_gpu_warmup_matmul.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from krex_client import warmup, warmup_matmul
from krex_client.region import region
from tests.client.conftest import FakeConnection
from tests.client.warmfakes import FakeTorch, Gpu, StandInShim, fake_pynvml

REPO = Path(__file__).resolve().parents[2]


def test_torch_counts_only_when_the_process_drives_cuda_with_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert warmup_matmul.torch_cuda() is None and warmup_matmul.for_process() is None
    torch = FakeTorch(Gpu())
    monkeypatch.setitem(sys.modules, "torch", torch)
    assert warmup_matmul.torch_cuda() is torch
    torch.initialized = False  # imported, CUDA never touched: no context is created
    assert warmup_matmul.torch_cuda() is None
    torch.initialized, torch.available = True, False
    assert warmup_matmul.torch_cuda() is None

    def broken() -> bool:
        raise RuntimeError("partially imported")

    torch.available = True
    torch.cuda.is_initialized = broken
    assert warmup_matmul.torch_cuda() is None


def test_krex_client_never_imports_torch(tmp_path: Path) -> None:
    # A "torch" on the path that fails loudly if anything imports it.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('torch was imported')\n")
    code = (
        "import sys\n"
        "from krex_client import region, warmup_matmul, warmup\n"
        "assert warmup_matmul.for_process() is None\n"
        "assert 'torch' not in sys.modules\n"
        "print('ok')\n"
    )
    env = dict(os.environ, PYTHONPATH=f"{tmp_path}:{REPO / 'python_client'}")
    p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr


def test_matmul_slices_stop_at_the_threshold() -> None:
    gpu = Gpu(warm_after_us=4000)
    torch = FakeTorch(gpu, matmul_us=200, cold_matmul_us=300)
    mm = warmup_matmul.Matmuls(torch, now=gpu.now)
    res = warmup.warm_up(mm, warmup.Policy(), gpu.clock, 1980, 990, gpu.now, kind="matmul")
    # One matmul to learn its time (300 µs cold), then 2000 // 300 = 6 per 2 ms slice:
    # 300 + 1800 + 1800 + 1800 µs of work; warm after the fourth slice.
    assert gpu.slices == [300, 1800, 1800, 1800]
    assert torch.calls == ["randn", "randn", "empty"] + ["matmul"] * 19 and mm.launched == 19
    assert res.kind == "matmul" and res.stop == "warm" and res.slices == 4
    assert res.sm_clock_mhz == 1980 and res.first_mhz == 990
    assert res.ms == pytest.approx(5.7)
    assert torch.pending_us == 0 and torch.stream.syncs == 4  # every slice synchronized
    # Warm at entry: no matmul at all.
    res = warmup.warm_up(mm, warmup.Policy(), gpu.clock, 1980, 1980, gpu.now, kind="matmul")
    assert res == warmup.Result(0.0, 1980, stop="warm_at_entry", first_mhz=1980)
    assert mm.launched == 19


def test_matmul_warm_up_respects_the_budget() -> None:
    gpu = Gpu()  # never warms
    torch = FakeTorch(gpu, cold_matmul_us=300)
    mm = warmup_matmul.Matmuls(torch, now=gpu.now)
    policy = warmup.Policy(budget_ms=10.0)
    res = warmup.warm_up(mm, policy, gpu.clock, 1980, 990, gpu.now, kind="matmul")
    assert res.stop == "budget" and res.sm_clock_mhz == 990 and res.kind == "matmul"
    # Each slice asks for what is left (at most 2 ms); the last one launches one
    # matmul for the 100 µs left: overshoot by at most one matmul.
    assert 10.0 <= res.ms <= 10.0 + 0.3 and sum(gpu.slices) == pytest.approx(res.ms * 1e3)
    assert max(gpu.slices) <= 2000
    # A matmul far shorter than the slice: at most MAX_PER_SLICE per slice.
    gpu = Gpu()
    torch = FakeTorch(gpu, cold_matmul_us=1)
    mm = warmup_matmul.Matmuls(torch, now=gpu.now)
    warmup.warm_up(mm, warmup.Policy(budget_ms=4.0), gpu.clock, 1980, 990, gpu.now)
    assert gpu.slices[0] == 1 and max(gpu.slices) == warmup_matmul.MAX_PER_SLICE


def test_operands_are_made_once_per_device_and_kept() -> None:
    gpu = Gpu()
    torch = FakeTorch(gpu)
    mm = warmup_matmul.Matmuls(torch, now=gpu.now)
    a = mm.operands(0)
    mm(2000)
    mm(2000)
    assert mm.operands(0) is a and torch.calls.count("randn") == 2
    assert a[0].dtype == "bfloat16" and a[0].shape == (warmup_matmul.SIZE, warmup_matmul.SIZE)
    torch.device, torch.bf16 = 1, False  # another current device, no bf16 there
    mm(2000)
    assert torch.calls.count("randn") == 4 and mm.operands(1)[0].dtype == "float16"
    assert mm.operands(1)[0].device == "cuda:1"


def test_an_open_capture_or_a_full_gpu_stops_the_matmul_warm_up(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    gpu = Gpu()
    torch = FakeTorch(gpu)
    mm = warmup_matmul.Matmuls(torch, now=gpu.now)
    torch.capturing = True  # the matmuls would join the graph being captured
    res = warmup.warm_up(mm, warmup.Policy(), gpu.clock, 1980, 990, gpu.now, kind="matmul")
    assert res.stop == "nothing_to_warm" and torch.calls == [] and res.slices == 1
    torch.capturing, torch.oom = False, True
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setattr(warmup_matmul, "_cached", None)
    cached = warmup_matmul.for_process()
    assert cached is not None
    res = warmup.warm_up(cached, warmup.Policy(), gpu.clock, 1980, 990, gpu.now, kind="matmul")
    assert res.stop == "failed" and res.error is not None and "out of memory" in res.error
    assert warmup_matmul.for_process() is None  # memsets from then on


def _records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture
def gpu_with_torch(
    standin: tuple[StandInShim, FakeConnection], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> tuple[StandInShim, FakeConnection, FakeTorch, list[bool]]:
    """The stand-in shim, a fake torch driving CUDA and NVML over one fake GPU
    that warms after 4 ms of work; a region log in tmp_path; ``held`` notes, for
    each matmul, whether krexd had granted the region."""
    shim, conn = standin
    gpu = Gpu(warm_after_us=4000)
    torch = FakeTorch(gpu)
    held: list[bool] = []

    def on_matmul() -> None:
        held.append(conn.held)
        shim.launched += 1  # the real shim counts every launch in the region

    torch.on_matmul = on_matmul
    memset = shim.warm

    def sleeping_memset(us: int) -> int:
        time.sleep(us / 1e6)  # the region's warm-up loop runs on the real clock
        return memset(us)

    monkeypatch.setattr(shim, "warm", sleeping_memset)
    monkeypatch.setitem(sys.modules, "torch", torch)
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(gpu))
    monkeypatch.setattr(warmup_matmul, "Matmuls", _on_fake_time(gpu))
    monkeypatch.setenv("KREX_REGION_LOG", str(tmp_path / "log"))
    return shim, conn, torch, held


def _on_fake_time(gpu: Gpu) -> Any:
    real = warmup_matmul.Matmuls

    def make(torch: Any) -> warmup_matmul.Matmuls:
        return real(torch, now=gpu.now)

    return make


def test_a_region_warms_with_matmuls_when_torch_drives_cuda(
    gpu_with_torch: tuple[StandInShim, FakeConnection, FakeTorch, list[bool]], tmp_path: Path
) -> None:
    shim, _, torch, held = gpu_with_torch
    pending_at_body: list[int] = []
    with region.critical():
        pending_at_body.append(torch.pending_us)
        shim.launched += 3  # the region's own code: three launches
    with region.critical():
        shim.launched += 2  # entered warm: no warm-up
    assert pending_at_body == [0]  # the warm-up's work was finished before the body
    assert held and all(held) and shim.warm_calls == []  # matmuls, in the region; no memsets
    first, second = _records(tmp_path / "log")
    warm = first["warmup"]
    assert warm["kind"] == "matmul" and warm["stop"] == "warm" and warm["launches"] == len(held)
    assert warm["sm_clock_before_mhz"] == 990 and warm["sm_clock_after_mhz"] == 1980
    assert warm["ms"] == first["warmup_ms"] > 0 and warm["budget_ms"] == 100.0
    assert warm["slices"] >= 2 and warm["error"] is None
    assert first["launches"] == 3  # the warm-up's launches are not the region's
    assert first["entry"]["sm_clock_mhz"] == 990 and first["warmed"]["sm_clock_mhz"] == 1980
    assert first["warnings"] == []
    assert second["warmup"]["kind"] == "none" and second["warmup"]["stop"] == "warm_at_entry"
    assert second["launches"] == 2 and second["warmup_ms"] == 0.0


def test_without_torch_driving_cuda_the_region_warms_with_memsets(
    gpu_with_torch: tuple[StandInShim, FakeConnection, FakeTorch, list[bool]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    shim, _, torch, held = gpu_with_torch
    torch.initialized = False  # imported, but CUDA is someone else's (or nobody's)
    monkeypatch.setenv(warmup.MS_VAR, "6")
    with region.critical():
        pass
    monkeypatch.delitem(sys.modules, "torch")  # no torch at all
    monkeypatch.setattr(region, "_device", None)
    with region.critical():
        pass
    slices = [us for us, _ in shim.warm_calls]
    assert held == [] and 2 <= len(slices) <= 6 and max(slices) == 2000
    for rec in _records(tmp_path / "log"):
        assert rec["warmup"]["kind"] == "memset" and rec["warmup"]["stop"] == "budget"
        assert rec["warmup"]["launches"] == 0 and rec["warmup"]["budget_ms"] == 6.0


def test_memsets_on_request_and_nothing_when_turned_off(
    gpu_with_torch: tuple[StandInShim, FakeConnection, FakeTorch, list[bool]],
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
) -> None:
    shim, _, torch, held = gpu_with_torch
    monkeypatch.setenv(warmup.KIND_VAR, "memset")
    monkeypatch.setenv(warmup.MS_VAR, "2")
    with region.critical():
        pass
    assert held == [] and len(shim.warm_calls) == 1
    monkeypatch.setenv(warmup.KIND_VAR, "auto")
    monkeypatch.setenv(warmup.MS_VAR, "0")
    with region.critical():
        pass
    assert held == [] and len(shim.warm_calls) == 1 and torch.calls == []
    memset, off = _records(tmp_path / "log")
    assert memset["warmup"]["kind"] == "memset"
    assert off["warmup"] == {
        "kind": "none",
        "ms": 0.0,
        "budget_ms": 0.0,
        "slices": 0,
        "launches": 0,
        "stop": "off",
        "error": None,
        "sm_clock_before_mhz": 990,
        "sm_clock_after_mhz": 990,
    }
    assert [w["kind"] for w in off["warnings"]] == ["cold_clock"]


def test_a_failed_matmul_warm_up_warns_and_the_region_runs(
    gpu_with_torch: tuple[StandInShim, FakeConnection, FakeTorch, list[bool]], tmp_path: Path
) -> None:
    shim, _, torch, _ = gpu_with_torch
    torch.oom = True
    ran = []
    with pytest.warns(RuntimeWarning, match="matmul clock warm-up .* failed .*out of memory"):
        with region.critical():
            ran.append(1)
    with region.critical():  # memsets from then on
        ran.append(2)
    assert ran == [1, 2] and shim.warm_calls
    failed, memset = _records(tmp_path / "log")
    assert failed["warmup"]["stop"] == "failed" and failed["warmup"]["kind"] == "matmul"
    assert memset["warmup"]["kind"] == "memset"
