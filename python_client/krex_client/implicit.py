"""Auto-regions: run measurements a script does not mark inside critical regions.

Opt-in, by one of:

* ``krex_client.autoregion()`` in code;
* ``KREX_AUTOREGION=1`` in the environment (``krex run --autoregion`` sets
  it).  It takes effect at interpreter start through the
  ``krex_client-autoregion.pth`` file the krex-client distribution installs
  (and the .deb/.rpm place beside krex_client), so a script that never
  imports krex_client is covered; where that file is absent (an editable or
  ``PYTHONPATH`` install) it takes effect when krex_client is imported.

Once on, each of these calls runs as one critical region (paper §4.1, "an
autotuner profiles internally"):

=================================================  ===============================
``triton.testing.do_bench``, ``do_bench_cudagraph``  the whole call
``triton.runtime.autotuner.Autotuner._bench``       one configuration's benchmark
``torch.utils.benchmark.Timer`` ``timeit``,          the whole call
``repeat``, ``autorange``, ``blocked_autorange``,
``adaptive_autorange``
=================================================  ===============================

Triton's autotuner times each configuration with ``do_bench`` (looked up on
``triton.testing`` at call time in 3.0/3.1; taken from
``driver.active.get_benchmarker()``, which imports ``triton.testing.do_bench``
when the autotuner is built, in 3.2+); ``_bench`` is wrapped as well so that
autotuners built before ``autoregion()`` ran, or given their own
``do_bench``, are covered.  Regions are re-entrant, so a ``do_bench`` inside
``_bench``, or an explicit ``region.critical()`` around either, is one region.

Nothing is imported here: a module is patched right after it is first
imported (a post-import hook on ``sys.meta_path``), or at once when it is
already loaded.  Patching is idempotent; patched callables keep their
signature (``functools.wraps``) and carry ``__krex_autoregion__ = True``.
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


def _patch_attrs(owner: Any, names: Sequence[str]) -> None:
    """Wrap each existing callable ``owner.<name>``; missing names are skipped."""
    for name in names:
        if isinstance(owner, type):
            # Plain functions defined on the class itself (not static/class methods).
            fn = owner.__dict__.get(name)
            if inspect.isfunction(fn):
                setattr(owner, name, _in_region(fn))
        else:
            fn = getattr(owner, name, None)
            if callable(fn):
                setattr(owner, name, _in_region(fn))


def _patch_triton_testing(mod: ModuleType) -> None:
    _patch_attrs(mod, ("do_bench", "do_bench_cudagraph"))


def _patch_autotuner(mod: ModuleType) -> None:
    autotuner = getattr(mod, "Autotuner", None)
    if isinstance(autotuner, type):
        _patch_attrs(autotuner, ("_bench",))


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
    """Turn auto-regions on for this process (idempotent; see the module docstring).

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
