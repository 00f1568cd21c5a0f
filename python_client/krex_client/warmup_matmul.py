"""Compute-bound warm-up slices: dense matmuls through the process's own torch.

Used by the clock warm-up (``krex_client.warmup``) when, and only when, the
process has imported torch and initialized CUDA with it (:func:`torch_cuda`):
krex_client never imports torch, nor creates a CUDA context a command did
not.  The slices' work, operands and sizing: docs/design/region-log.md
"Clock warm-up" and :class:`Matmuls`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable
from typing import Any

SIZE = 4096
"""Rows and columns of each square operand."""
MAX_PER_SLICE = 256
"""Most matmuls one slice launches (a bound on a wrong time estimate)."""


def torch_cuda() -> Any | None:
    """The process's torch module when it has imported torch and initialized
    CUDA through it (``torch.cuda.is_initialized()``); else None.

    Looks in ``sys.modules`` only: never imports torch, never initializes CUDA.
    """
    torch: Any = sys.modules.get("torch")
    cuda = getattr(torch, "cuda", None)
    if cuda is None:
        return None
    try:
        if cuda.is_initialized() and cuda.is_available():
            return torch
    except Exception:  # noqa: BLE001 - a broken or partial torch: no matmul warm-up
        return None
    return None


class Matmuls:
    """A :data:`krex_client.warmup.Slice` of dense matmuls.

    Each slice launches ``n`` matmuls of two ``SIZE`` x ``SIZE`` operands
    (bf16, fp16 where bf16 is not supported) into a third, on the current
    device and stream, then synchronizes that stream, so the work is done
    when the slice returns; ``n`` comes from the last slice's time per
    matmul (one matmul first).  The three operands (96 MiB at 4096) are
    allocated once per device and process from the caching allocator,
    filled from a private generator (the command's random state is
    untouched), and kept: nothing the command owns is freed or reused.

    ``launched`` counts the matmuls launched so far (each one kernel launch
    or more, as cuBLAS decides); ``broken`` says why the operands could not
    be made (then :func:`for_process` gives None: memsets from then on).
    """

    def __init__(
        self, torch: Any, size: int = SIZE, now: Callable[[], float] = time.perf_counter
    ) -> None:
        # ``now``: a monotonic clock in seconds (tests pass a fake).
        self.torch = torch
        self.size = size
        self.now = now
        self.launched = 0
        self.broken: str | None = None
        self._operands: dict[int, tuple[Any, Any, Any]] = {}
        self._us_per: dict[int, float] = {}  # µs per matmul in the last slice, per device

    def operands(self, device: int) -> tuple[Any, Any, Any]:
        """``(a, b, out)`` on ``device``: allocated and filled on first use, then kept.

        Raises what torch raises (``torch.cuda.OutOfMemoryError`` on a full GPU).
        """
        ops = self._operands.get(device)
        if ops is None:
            try:
                ops = self._operands[device] = self._make(device)
            except Exception as exc:
                self.broken = f"{type(exc).__name__}: {exc}"
                raise
        return ops

    def _make(self, device: int) -> tuple[Any, Any, Any]:
        torch, n = self.torch, self.size
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
        gen = torch.Generator(device=f"cuda:{device}")
        gen.manual_seed(0x6B726578)
        kw = {"device": f"cuda:{device}", "dtype": dtype}
        a = torch.randn((n, n), generator=gen, **kw)
        b = torch.randn((n, n), generator=gen, **kw)
        return a, b, torch.empty((n, n), **kw)

    def __call__(self, budget_us: int) -> int:
        """Matmuls on the current device and stream for about ``budget_us`` µs,
        synchronized; the µs spent (at least 1), or 0 when the current stream
        is capturing a graph (the matmuls would join the capture)."""
        torch = self.torch
        if torch.cuda.is_current_stream_capturing():
            return 0
        device = int(torch.cuda.current_device())
        a, b, out = self.operands(device)
        per = self._us_per.get(device)
        n = 1 if per is None else max(1, min(MAX_PER_SLICE, int(budget_us / per)))
        stream = torch.cuda.current_stream()
        t0 = self.now()
        for _ in range(n):
            torch.matmul(a, b, out=out)
        self.launched += n
        stream.synchronize()
        spent_us = (self.now() - t0) * 1e6
        self._us_per[device] = max(spent_us / n, 1.0)
        return max(1, round(spent_us))


_cached: tuple[int, Matmuls] | None = None


def for_process() -> Matmuls | None:
    """This process's :class:`Matmuls` (one per process, so operands are kept
    across regions) when :func:`torch_cuda` finds torch driving CUDA; else None."""
    global _cached
    torch = torch_cuda()
    if torch is None:
        return None
    if _cached is None or _cached[0] != os.getpid() or _cached[1].torch is not torch:
        _cached = (os.getpid(), Matmuls(torch))
    return None if _cached[1].broken else _cached[1]
