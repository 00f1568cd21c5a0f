"""Auto-regions: run measurements a script does not mark inside critical regions.

Opt-in (``autoregion()``, or ``KREX_AUTOREGION=1`` through the
``krex_client-autoregion.pth`` file or krex_client's import): Triton's
``do_bench`` family, its autotuner's tuning steps and ``torch.utils.benchmark.Timer``
run in regions, each first call (the compile) primed outside.  What is
patched and why: python_client/README.md "Auto-regions",
docs/design/region-log.md "Clock warm-up".  Nothing is imported here: a
module is patched right after its first import (:data:`PATCHES`, a
post-import hook on ``sys.meta_path``), idempotently, each patched callable
keeping its signature and carrying ``__krex_autoregion__ = True``.
"""

from __future__ import annotations

import functools
import importlib.abc
import importlib.machinery
import inspect
import os
import sys
import threading
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

from krex_client import tuning_step

__all__ = ["autoregion", "enabled", "activate_from_env", "ENV_VAR"]

ENV_VAR = "KREX_AUTOREGION"
"""Environment variable that turns auto-regions on ("1", "true", "yes", "on")."""

MARK = "__krex_autoregion__"

_TIMER_METHODS = ("timeit", "repeat", "autorange", "blocked_autorange", "adaptive_autorange")

_lock = threading.Lock()
_enabled = False


def _in_region(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` wrapped to run inside ``region.critical()`` (unchanged if already wrapped)."""
    if getattr(fn, MARK, False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from krex_client.region import region

        with region.critical():
            return fn(*args, **kwargs)

    setattr(wrapper, MARK, True)
    return wrapper


def _primed_in_region(bench: Callable[..., Any]) -> Callable[..., Any]:
    """``bench`` (a ``do_bench(fn, ...)``) wrapped to call ``fn`` once outside its region.

    Under krex, while no region of the process is open: ``fn()`` and a
    device synchronization (:func:`_synchronize`), unprotected, then the whole
    ``bench`` call inside ``region.critical()``.  Inside a region, while
    another thread holds one (the first call would run alongside its timed
    code; instead this waits for the region, as before), or off krex, just the
    region.  An exception of the first
    ``fn()`` or of the synchronization propagates with no region entered, as it
    would out of Triton's own first call.  Unchanged if already wrapped.

    That priming call is untimed, runs beside the siblings, and makes ``fn``
    run once more than without krex (Triton's own first call, now compiled,
    is quick); ``do_bench_cudagraph`` is primed the same way, by an eager
    call on the current stream, never a capture (Triton captures inside the
    region, after its own eager call).
    """
    if getattr(bench, MARK, False):
        return bench
    try:
        signature: inspect.Signature | None = inspect.signature(bench)
    except (TypeError, ValueError):
        signature = None

    @functools.wraps(bench)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from krex_client.region import region

        served = tuning_step.take_served()
        if served is not tuning_step.NOT_SERVED:  # its step timed this configuration interleaved
            return served
        record = tuning_step.priming()
        if record is not None:  # a tuning step primes its configurations: first call only
            record.benchmarker = getattr(bench, "__name__", "")
            record.options = _options(signature, args, kwargs)
            record.timed = _timed_callable(signature, args, kwargs)
            return _prime_only(record, record.timed, kwargs)
        if region.under_krex() and not region.inside() and not region.busy():
            timed = _timed_callable(signature, args, kwargs)
            if timed is not None:
                timed()
                _synchronize()
        with region.critical():
            return bench(*args, **kwargs)

    setattr(wrapper, MARK, True)
    return wrapper


def _prime_only(
    record: tuning_step.Priming, timed: Callable[[], Any] | None, kwargs: dict[str, Any]
) -> Any:
    """Triton's first call of a ``do_bench``, untimed, for a tuning step's priming.

    Sets ``record.state`` (:class:`~krex_client.tuning_step.Priming`) and
    re-raises what ``fn()`` or the synchronization raised.
    """
    if timed is not None:
        record.state = "raised"
        timed()
        _synchronize()
        record.state = "ran"
    return tuning_step.placeholder(kwargs)


def _timed_callable(
    signature: inspect.Signature | None, args: Sequence[Any], kwargs: dict[str, Any]
) -> Callable[[], Any] | None:
    """The function a ``do_bench(fn, ...)`` call times: its first parameter's value.

    None when the arguments do not bind (the original raises its own error) or
    the value is not callable.
    """
    if signature is None:
        first = args[0] if args else kwargs.get("fn")
    else:
        try:
            bound = signature.bind(*args, **kwargs)
        except TypeError:
            return None
        name = next(iter(signature.parameters), None)
        first = bound.arguments.get(name) if name is not None else None
    return first if callable(first) else None


def _options(
    signature: inspect.Signature | None, args: Sequence[Any], kwargs: dict[str, Any]
) -> dict[str, Any] | None:
    """A ``do_bench(fn, ...)`` call's arguments but ``fn``, defaults applied; None if unbound."""
    if signature is None:
        return None
    try:
        bound = signature.bind(*args, **kwargs)
    except TypeError:
        return None
    bound.apply_defaults()
    options = dict(bound.arguments)
    options.pop(next(iter(signature.parameters)), None)
    return options


def _synchronize() -> None:
    """Wait for the device work queued so far, as ``do_bench`` does after its first call.

    Through Triton's active driver's device interface, as Triton 3.1+ does
    (``torch.cuda`` for CUDA); where the driver has none (Triton 3.0 asked
    torch's device interface), ``torch.cuda.synchronize()`` when torch has
    initialized CUDA; nothing when neither is loaded.  Imports nothing: both
    are in ``sys.modules`` whenever a Triton benchmark runs.
    """
    runtime = sys.modules.get("triton.runtime")
    active = getattr(getattr(runtime, "driver", None), "active", None)
    device_interface = getattr(active, "get_device_interface", None)
    if callable(device_interface):
        device_interface().synchronize()
        return
    cuda = getattr(sys.modules.get("torch"), "cuda", None)
    if cuda is not None and cuda.is_initialized():
        cuda.synchronize()


def _bench_in_region(bench: Callable[..., Any]) -> Callable[..., Any]:
    """``Autotuner._bench`` wrapped: in one region unless it times through a primed do_bench.

    When the autotuner's benchmarker is a :func:`_primed_in_region` wrapper
    (:func:`_times_through_primed`), ``_bench`` runs as is: its ``do_bench``
    compiles the configuration outside the region and times it inside one.
    Otherwise (a benchmarker of the script's own, Triton's deprecated
    ``warmup``/``rep`` lambdas, an autotuner built before ``autoregion()``)
    the whole ``_bench`` is one region, compile included.  Unchanged if
    already wrapped.
    """
    if getattr(bench, MARK, False):
        return bench

    @functools.wraps(bench)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        step = tuning_step.active(self)
        if step is not None and step.covers(kwargs):
            return step.bench(bench, self, args, kwargs, _times_through_primed(self, bench))
        if _times_through_primed(self, bench):
            return bench(self, *args, **kwargs)
        from krex_client.region import region

        with region.critical():
            return bench(self, *args, **kwargs)

    setattr(wrapper, MARK, True)
    return wrapper


def _times_through_primed(tuner: Any, bench: Callable[..., Any]) -> bool:
    """True when ``tuner``'s ``bench`` (the unwrapped ``_bench``) calls a patched do_bench.

    Triton 3.2+: the instance's ``do_bench`` (an attribute set in ``__init__``;
    a cached property in 3.4+, which this reads as ``_bench`` would).
    Triton 3.0/3.1: none; ``_bench`` calls its module's ``do_bench`` (or
    ``do_bench_cudagraph`` with ``use_cuda_graph``), names bound from
    ``triton.testing`` when the module was imported.
    """
    try:
        timer = getattr(tuner, "do_bench", None)
    except Exception:  # noqa: BLE001 - the benchmarker cannot be built: _bench fails alike
        return False
    if timer is None:
        name = "do_bench_cudagraph" if getattr(tuner, "use_cuda_graph", False) else "do_bench"
        timer = getattr(bench, "__globals__", {}).get(name)
    return bool(getattr(timer, MARK, False))


def _patch_attrs(
    owner: Any,
    names: Sequence[str],
    wrap: Callable[[Callable[..., Any]], Callable[..., Any]] = _in_region,
) -> None:
    """Replace each callable ``owner.<name>`` by ``wrap(it)``; missing names are skipped."""
    for name in names:
        if isinstance(owner, type):
            # Plain functions defined on the class itself (not static/class methods).
            fn = owner.__dict__.get(name)
            if inspect.isfunction(fn):
                setattr(owner, name, wrap(fn))
        else:
            fn = getattr(owner, name, None)
            if callable(fn):
                setattr(owner, name, wrap(fn))


_BENCHMARKERS = ("do_bench", "do_bench_cudagraph")


def _patch_triton_testing(mod: ModuleType) -> None:
    _patch_attrs(mod, _BENCHMARKERS, _primed_in_region)


def _patch_autotuner(mod: ModuleType) -> None:
    # Triton 3.0/3.1 bind do_bench and do_bench_cudagraph in this module at import.
    _patch_attrs(mod, _BENCHMARKERS, _primed_in_region)
    autotuner = getattr(mod, "Autotuner", None)
    if isinstance(autotuner, type):
        _patch_attrs(autotuner, ("_bench",), _bench_in_region)
        _patch_attrs(autotuner, ("run",), tuning_step.wrap_run)
        _patch_attrs(autotuner, ("prune_configs",), tuning_step.wrap_prune)


def _patch_timer_module(mod: ModuleType) -> None:
    timer = getattr(mod, "Timer", None)
    if isinstance(timer, type):
        _patch_attrs(timer, _TIMER_METHODS)


PATCHES: dict[str, Callable[[ModuleType], None]] = {
    "triton.testing": _patch_triton_testing,
    "triton.runtime.autotuner": _patch_autotuner,
    # Timer is defined in .utils.timer and re-exported by torch.utils.benchmark:
    # either name patches the same class (once).
    "torch.utils.benchmark.utils.timer": _patch_timer_module,
    "torch.utils.benchmark": _patch_timer_module,
}
"""Module name -> function patching it in place, applied right after its import."""


class _PatchingLoader(importlib.abc.Loader):
    """Delegates to the real loader, then patches the module it executed."""

    def __init__(self, loader: Any, patch: Callable[[ModuleType], None]) -> None:
        self._loader = loader
        self._patch = patch

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        module: ModuleType | None = self._loader.create_module(spec)
        return module

    def exec_module(self, module: ModuleType) -> None:
        # The module sees its own loader, as it would without the hook.
        module.__loader__ = self._loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._loader, name)


class _PostImportFinder(importlib.abc.MetaPathFinder):
    """Finds nothing itself: marks the specs of :data:`PATCHES`' modules for patching."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        patch = PATCHES.get(fullname)
        if patch is None:
            return None
        for finder in list(sys.meta_path):
            if finder is self or isinstance(finder, _PostImportFinder):
                continue
            find = getattr(finder, "find_spec", None)
            spec: importlib.machinery.ModuleSpec | None = (
                find(fullname, path, target) if find is not None else None
            )
            if spec is None:
                continue
            if spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return None  # a namespace package or an old loader: import it unpatched
            spec.loader = _PatchingLoader(spec.loader, patch)
            return spec
        return None


def enabled() -> bool:
    """True once :func:`autoregion` has run in this process."""
    return _enabled


def autoregion() -> None:
    """Turn auto-regions on for this process (idempotent).

    Modules already imported are patched now; the others when first imported.
    Imports neither torch nor triton.
    """
    global _enabled
    with _lock:
        if not any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
            sys.meta_path.insert(0, _PostImportFinder())
        _enabled = True
        for name, patch in PATCHES.items():
            mod = sys.modules.get(name)
            if mod is not None:
                patch(mod)


def env_requests_autoregion(environ: dict[str, str] | None = None) -> bool:
    """True when ``KREX_AUTOREGION`` (in ``environ``, default ``os.environ``) is on."""
    value = (os.environ if environ is None else environ).get(ENV_VAR, "")
    return value.strip().lower() in ("1", "true", "yes", "on")


def activate_from_env() -> None:
    """Call :func:`autoregion` when ``KREX_AUTOREGION`` asks for it (else nothing)."""
    if env_requests_autoregion():
        autoregion()
