"""Timing backends and statistics behind :mod:`krex_client.testing`.

A backend gives the timing loops what ``triton.testing`` takes from
PyTorch: :class:`TorchCudaBackend` (CUDA events and graphs) where PyTorch
sees a CUDA device, else :class:`HostBackend` (the host's clock, one
warning: it times the host side of ``fn`` only).  Tests substitute their
own with :func:`use_backend`.
"""

from __future__ import annotations

import contextlib
import math
import statistics
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Protocol

RETURN_MODES = ("min", "max", "mean", "median", "all")
"""``return_mode`` values of ``triton.testing.do_bench`` (3.x)."""

L2_FLUSH_BYTES = 256 * 1024 * 1024
"""Bytes overwritten before each repetition (Triton's buffer; larger than any L2 today)."""


class Event(Protocol):
    """A timing event: ``record()`` on the current stream, ``elapsed_time(end)`` in ms."""

    def record(self) -> None:
        """Mark this point of the stream."""
        ...

    def elapsed_time(self, end: Any) -> float:
        """Milliseconds from this event to ``end`` (both recorded and complete)."""
        ...


class Graph(Protocol):
    """A captured sequence of launches, replayed as one."""

    def replay(self) -> None:
        """Launch the captured work again."""
        ...


class Backend(Protocol):
    """What the timing loops need of a device: a synchronize, timing events
    (``record()``, ``elapsed_time(end)`` in ms), an L2-sized buffer to overwrite
    between repetitions, a side stream and graph capture."""

    name: str

    def synchronize(self) -> None:
        """Wait until all work queued on the device is done."""
        ...

    def event(self) -> Event:
        """A new timing event."""
        ...

    def flush_buffer(self) -> Any:
        """An L2-sized buffer for :meth:`flush` (allocated once per measurement)."""
        ...

    def flush(self, buffer: Any) -> None:
        """Overwrite ``buffer`` so that no input of ``fn`` stays in L2."""
        ...

    def side_stream(self) -> contextlib.AbstractContextManager[Any]:
        """Make a fresh non-default stream current (graph capture needs one)."""
        ...

    def capture(self, fn: Callable[[], Any]) -> Graph:
        """Capture what ``fn`` launches into a graph (run once, not executed)."""
        ...


class HostBackend:
    """Host clock timing: no device, nothing to synchronize or flush."""

    name = "host"

    class _Event:
        def __init__(self) -> None:
            self.t_ns = 0

        def record(self) -> None:
            self.t_ns = time.perf_counter_ns()

        def elapsed_time(self, end: Any) -> float:
            return float(end.t_ns - self.t_ns) / 1e6

    class _Graph:
        def __init__(self, fn: Callable[[], Any]) -> None:
            self._fn = fn

        def replay(self) -> None:
            self._fn()

    def synchronize(self) -> None:
        """Nothing is queued anywhere: returns at once."""

    def event(self) -> Event:
        """An event holding ``time.perf_counter_ns()`` at ``record()``."""
        return HostBackend._Event()

    def flush_buffer(self) -> Any:
        """No cache to flush on the host: ``None``."""
        return None

    def flush(self, buffer: Any) -> None:
        """Nothing to do."""

    def side_stream(self) -> contextlib.AbstractContextManager[Any]:
        """No streams on the host: a context that does nothing."""
        return contextlib.nullcontext()

    def capture(self, fn: Callable[[], Any]) -> Graph:
        """A "graph" that calls ``fn`` again on every replay (nothing is captured)."""
        return HostBackend._Graph(fn)


class TorchCudaBackend:
    """PyTorch's CUDA events, streams and graphs on the current device."""

    name = "torch-cuda"

    def __init__(self, torch: Any) -> None:
        self._torch = torch

    def synchronize(self) -> None:
        """``torch.cuda.synchronize()``."""
        self._torch.cuda.synchronize()

    def event(self) -> Event:
        """``torch.cuda.Event(enable_timing=True)``."""
        ev: Event = self._torch.cuda.Event(enable_timing=True)
        return ev

    def flush_buffer(self) -> Any:
        """An int32 tensor of max(L2 size, :data:`L2_FLUSH_BYTES`) bytes on the device."""
        torch = self._torch
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        size = max(int(getattr(props, "L2_cache_size", 0)), L2_FLUSH_BYTES)
        return torch.empty(size // 4, dtype=torch.int, device="cuda")

    def flush(self, buffer: Any) -> None:
        """``buffer.zero_()``: one memset kernel over the whole buffer."""
        buffer.zero_()

    def side_stream(self) -> contextlib.AbstractContextManager[Any]:
        """``torch.cuda.stream(torch.cuda.Stream())``."""
        cm: contextlib.AbstractContextManager[Any] = self._torch.cuda.stream(
            self._torch.cuda.Stream()
        )
        return cm

    def capture(self, fn: Callable[[], Any]) -> Graph:
        """A ``torch.cuda.CUDAGraph`` holding what ``fn`` launched."""
        graph = self._torch.cuda.CUDAGraph()
        with self._torch.cuda.graph(graph):
            fn()
        captured: Graph = graph
        return captured


_override: Backend | None = None
_host_warned = False


@contextlib.contextmanager
def use_backend(backend: Backend) -> Iterator[Backend]:
    """Make ``backend`` the one :func:`current_backend` returns inside the block."""
    global _override
    previous, _override = _override, backend
    try:
        yield backend
    finally:
        _override = previous


def current_backend() -> Backend:
    """The backend for the next measurement (``TorchCudaBackend`` or ``HostBackend``).

    PyTorch is imported here, at the first measurement, never at import time.
    """
    global _host_warned
    if _override is not None:
        return _override
    try:
        import torch
    except ImportError:
        torch = None
    if torch is not None and torch.cuda.is_available():
        return TorchCudaBackend(torch)
    if not _host_warned:
        _host_warned = True
        warnings.warn(
            "krex_client.testing: PyTorch with CUDA is not available; timing on the host "
            "clock (the figures cover only the host side of the function)",
            RuntimeWarning,
            stacklevel=3,
        )
    return HostBackend()


MIN_ESTIMATE_MS = 1e-4
"""The least estimate of one call :func:`count` divides by (100 ns)."""


ESTIMATE_CALLS = 5
"""Calls whose mean estimates one call (Triton's five)."""


def estimate_ms(backend: Backend, fn: Callable[[], Any], cache: Any) -> float:
    """``do_bench``'s estimate of one call of ``fn``, in ms: :data:`ESTIMATE_CALLS`
    calls, each after flushing ``cache`` (:meth:`Backend.flush`), between two
    events, then a synchronization; their mean."""
    start, end = backend.event(), backend.event()
    start.record()
    for _ in range(ESTIMATE_CALLS):
        backend.flush(cache)
        fn()
    end.record()
    backend.synchronize()
    return float(start.elapsed_time(end)) / ESTIMATE_CALLS


def count(budget_ms: float, estimate_ms: float) -> int:
    """``max(1, int(budget / estimate))``: Triton's warm-up and repetition counts.

    An estimate below :data:`MIN_ESTIMATE_MS` (a coarse host clock reads 0)
    counts as that, so the count stays bounded where Triton would divide by zero.
    """
    if not math.isfinite(estimate_ms) or estimate_ms < MIN_ESTIMATE_MS:
        estimate_ms = MIN_ESTIMATE_MS
    return max(1, int(budget_ms / estimate_ms))


def clear_grads(grad_to_none: Sequence[Any] | None) -> None:
    """Set ``.grad`` of each tensor of ``grad_to_none`` to None (before a repetition)."""
    if grad_to_none is not None:
        for x in grad_to_none:
            x.grad = None


def device_backend() -> Backend | None:
    """The backend :func:`current_backend` would return, or None where it would time on the host.

    For callers that have a fallback of their own: warns nothing, and imports
    PyTorch only when it is importable.
    """
    if _override is not None:
        return _override
    try:
        import torch
    except ImportError:
        return None
    cuda = getattr(torch, "cuda", None)  # None in a stand-in torch
    return TorchCudaBackend(torch) if cuda is not None and cuda.is_available() else None


def check_return_mode(return_mode: str) -> None:
    """Raise ``ValueError`` unless ``return_mode`` is one of :data:`RETURN_MODES`."""
    if return_mode not in RETURN_MODES:
        raise ValueError(f"unknown return_mode {return_mode!r}; expected one of {RETURN_MODES}")


def quantiles_of(times: Sequence[float], qs: Sequence[float]) -> list[float]:
    """Quantiles ``qs`` (each in [0, 1]) of ``times``, linearly interpolated.

    The same definition as ``torch.quantile`` (and Triton's): position
    ``q * (n - 1)`` in the sorted samples.  Raises ``ValueError`` for an empty
    ``times`` or a ``q`` outside [0, 1].
    """
    if not times:
        raise ValueError("no samples")
    ordered = sorted(times)
    out: list[float] = []
    for q in qs:
        if not 0.0 <= q <= 1.0:
            raise ValueError(f"quantile {q!r} is outside [0, 1]")
        pos = q * (len(ordered) - 1)
        lo, hi = math.floor(pos), math.ceil(pos)
        out.append(ordered[lo] + (ordered[hi] - ordered[lo]) * (pos - lo))
    return out


def summarize(
    times: Sequence[float], quantiles: Sequence[float] | None, return_mode: str
) -> float | list[float]:
    """Triton's return shape: quantiles (a float when one) else the ``return_mode`` statistic.

    ``"all"`` returns the samples as a list of floats.
    """
    if quantiles is not None:
        qs = quantiles_of(times, quantiles)
        return qs[0] if len(qs) == 1 else qs
    if return_mode == "all":
        return [float(t) for t in times]
    if return_mode == "min":
        return float(min(times))
    if return_mode == "max":
        return float(max(times))
    if return_mode == "median":
        # torch.median's: the lower of the two middle samples when their number is even.
        return float(sorted(times)[(len(times) - 1) // 2])
    return float(statistics.fmean(times))
