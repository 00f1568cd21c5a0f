"""Fakes for the clock warm-up tests: a GPU whose SM clock warms with work, the
shim's holder-side calls, ``pynvml`` and the part of ``torch`` the matmul
warm-up uses (tests/client/test_warmup.py, tests/client/test_warmup_matmul.py).

Time is fake: it moves only when the GPU "works" (a memset slice, or a
synchronization of queued matmuls), so budgets and slices are exact.
"""

from __future__ import annotations

import types
from collections.abc import Callable
from typing import Any


class Gpu:
    """A fake clock (s) and SM clock: ``warm(us)`` advances the time by ``us``
    and, after ``warm_after_us`` of warming, the SM clock reads its maximum."""

    def __init__(self, warm_after_us: int | None = None, cold_mhz: int = 990) -> None:
        self.t = 100.0
        self.warmed_us = 0
        self.slices: list[int] = []
        self.warm_after_us = warm_after_us
        self.cold_mhz = cold_mhz

    def now(self) -> float:
        return self.t

    def warm(self, us: int) -> int:
        self.slices.append(us)
        self.t += us / 1e6
        self.warmed_us += us
        return us

    def clock(self) -> int:
        if self.warm_after_us is not None and self.warmed_us >= self.warm_after_us:
            return 1980
        return self.cold_mhz


class StandInShim:
    """The shim's holder-side calls; ``warm`` (memsets) notes whether krexd had
    granted; ``launched`` is the shim's launch counter (reset at region begin)."""

    def __init__(self, conn: Any) -> None:
        self.conn = conn
        self.warm_calls: list[tuple[int, bool]] = []
        self.launched = 0

    def region_begin(self, epoch: int, l2_flush: bool) -> bool:
        self.launched = 0
        return True

    def warm(self, us: int) -> int:
        self.warm_calls.append((us, self.conn.held))
        return us

    def launches(self) -> int | None:
        return self.launched

    def region_end(self) -> tuple[float, int]:
        return 0.0, self.launched

    def other_streams_ms(self) -> float | None:
        return None

    def events_outside(self) -> tuple[int, int]:
        return 0, 0


def fake_pynvml(gpu: Gpu) -> types.ModuleType:
    """A ``pynvml`` whose SM clock is ``gpu.clock()`` (maximum 1980 MHz)."""
    nv: Any = types.ModuleType("pynvml")
    nv.NVML_CLOCK_SM, nv.NVML_CLOCK_MEM, nv.NVML_TEMPERATURE_GPU = 1, 2, 0
    nv.nvmlInit = lambda: None
    nv.nvmlDeviceGetHandleByIndex = lambda i: i
    nv.nvmlDeviceGetHandleByUUID = lambda u: u
    nv.nvmlDeviceGetName = lambda h: b"NVIDIA H200"
    nv.nvmlDeviceGetUUID = lambda h: "GPU-1234"
    nv.nvmlDeviceGetMaxClockInfo = lambda h, c: 1980
    nv.nvmlDeviceGetClockInfo = lambda h, c: gpu.clock() if c == 1 else 2619
    nv.nvmlDeviceGetTemperature = lambda h, s: 41
    nv.nvmlDeviceGetPowerUsage = lambda h: 100_000
    module: types.ModuleType = nv
    return module


class FakeTensor:
    def __init__(self, shape: tuple[int, ...], device: str, dtype: str) -> None:
        self.shape, self.device, self.dtype = shape, device, dtype


class FakeStream:
    """``synchronize()`` runs the queued matmuls on ``gpu`` (the time moves)."""

    def __init__(self, torch: FakeTorch) -> None:
        self.torch = torch
        self.syncs = 0

    def synchronize(self) -> None:
        self.syncs += 1
        if self.torch.pending_us:
            self.torch.gpu.warm(self.torch.pending_us)
            self.torch.pending_us = 0


class FakeGenerator:
    def __init__(self, device: str) -> None:
        self.device: str = device
        self.seed: int | None = None

    def manual_seed(self, seed: int) -> FakeGenerator:
        self.seed = seed
        return self


class FakeTorch(types.ModuleType):
    """What :mod:`krex_client.warmup_matmul` asks of torch.

    Each matmul queues ``matmul_us`` of device work (``cold_matmul_us`` while
    the SM clock is cold) on the current stream; ``on_matmul`` is called for
    each (tests note the region state or count shim launches there).
    ``initialized``/``capturing``/``bf16``/``oom`` set what ``torch.cuda``
    answers.  ``calls`` lists ``randn``/``empty``/``matmul`` calls in order.
    """

    bfloat16, float16 = "bfloat16", "float16"

    def __init__(self, gpu: Gpu, matmul_us: int = 200, cold_matmul_us: int = 300) -> None:
        super().__init__("torch")
        self.gpu = gpu
        self.matmul_us, self.cold_matmul_us = matmul_us, cold_matmul_us
        self.pending_us = 0
        self.calls: list[str] = []
        self.initialized = self.available = self.bf16 = True
        self.capturing = self.oom = False
        self.device = 0
        self.on_matmul: Callable[[], None] = lambda: None
        self.stream = FakeStream(self)
        self.Generator = FakeGenerator
        self.cuda = types.SimpleNamespace(
            is_initialized=lambda: self.initialized,
            is_available=lambda: self.available,
            is_bf16_supported=lambda: self.bf16,
            is_current_stream_capturing=lambda: self.capturing,
            current_device=lambda: self.device,
            current_stream=lambda: self.stream,
        )

    def _alloc(self, what: str, shape: tuple[int, ...], device: str, dtype: str) -> FakeTensor:
        if self.oom:
            raise MemoryError("CUDA out of memory (fake)")
        self.calls.append(what)
        return FakeTensor(shape, device, dtype)

    def randn(
        self, shape: tuple[int, ...], *, generator: FakeGenerator, device: str, dtype: str
    ) -> FakeTensor:
        assert generator.seed is not None and generator.device == device
        return self._alloc("randn", shape, device, dtype)

    def empty(self, shape: tuple[int, ...], *, device: str, dtype: str) -> FakeTensor:
        return self._alloc("empty", shape, device, dtype)

    def matmul(self, a: FakeTensor, b: FakeTensor, *, out: FakeTensor) -> FakeTensor:
        assert a.device == b.device == out.device == f"cuda:{self.device}"
        self.calls.append("matmul")
        cold = self.gpu.clock() < 0.9 * 1980
        self.pending_us += self.cold_matmul_us if cold else self.matmul_us
        self.on_matmul()
        return out
