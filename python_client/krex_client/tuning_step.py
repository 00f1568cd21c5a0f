"""Auto-regions for Triton's autotuner: one critical region per tuning step.

A tuning step (``Autotuner.run`` of a key with no cached configuration)
primes every configuration outside the region, then times them all in one
region, interleaved by default (``KREX_AUTOTUNE_ORDER``), instead of one
region per configuration (``KREX_AUTOTUNE_REGION=config``).  Why, and what
happens when a configuration fails: docs/design/region-log.md "Clock
warm-up"; the step's life: :class:`Step`.
"""

from __future__ import annotations

import contextlib
import functools
import math
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from krex_client import _timing, interleaved, warmup

SCOPE_VAR = "KREX_AUTOTUNE_REGION"
"""``step`` (default): one region per tuning step; ``config``: one per configuration."""

MARK = "__krex_autoregion__"

_local = threading.local()  # .steps: {id(autotuner): Step}; .priming: Priming | None


def step_scope(environ: dict[str, str] | None = None) -> bool:
    """False when ``KREX_AUTOTUNE_REGION`` (in ``environ``, default ``os.environ``) is ``config``.

    Any other value but ``step`` or empty warns once (RuntimeWarning, as the
    warm-up's variables do) and the default, ``step``, applies.
    """
    value = (os.environ if environ is None else environ).get(SCOPE_VAR, "").strip().lower()
    if value == "config":
        return False
    if value not in ("", "step"):
        warmup.warn_once(SCOPE_VAR, f"{SCOPE_VAR}={value!r} is neither 'step' nor 'config'")
    return True


ORDER_VAR = "KREX_AUTOTUNE_ORDER"
"""``interleaved`` (default): a step's configurations are timed in interleaved
repetitions; ``sequential``: one after the other, each by its ``do_bench``."""

OPTIONS = ("warmup", "rep", "grad_to_none", "quantiles", "return_mode", "fast_flush", "device_type")
"""``do_bench`` arguments an interleaved timing honours: ``fast_flush`` (of
Triton before 3.2) flushes L2 with the same buffer either way;
``device_type`` (of some 3.x) only when it is ``"cuda"``."""

NOT_SERVED = object()
"""What :func:`take_served` returns when no result waits for this thread's ``do_bench``."""


def interleaving(environ: dict[str, str] | None = None) -> bool:
    """False when ``KREX_AUTOTUNE_ORDER`` (``environ``, default ``os.environ``) is ``sequential``.

    Any other value but ``interleaved`` or empty warns once and the default applies.
    """
    value = (os.environ if environ is None else environ).get(ORDER_VAR, "").strip().lower()
    if value == "sequential":
        return False
    if value not in ("", "interleaved"):
        warmup.warn_once(
            ORDER_VAR, f"{ORDER_VAR}={value!r} is neither 'interleaved' nor 'sequential'"
        )
    return True


@dataclass
class Priming:
    """What the patched benchmarker did during one priming ``_bench``.

    ``state``: ``"skipped"`` (no timed callable found: nothing ran),
    ``"ran"`` (``fn()`` and the synchronization returned) or ``"raised"``.
    ``timed``: the callable the ``do_bench`` call was given; ``options``: its
    other arguments, defaults applied (None when they do not bind);
    ``benchmarker``: the patched function's name (``do_bench``,
    ``do_bench_cudagraph``).
    """

    state: str = "skipped"
    timed: Callable[[], Any] | None = None
    options: dict[str, Any] | None = None
    benchmarker: str = ""

    def interleavable(self) -> interleaved.Timed | None:
        """This configuration as an interleaved timing's entry, or None where it cannot be one.

        None unless the priming ran a ``do_bench`` (not ``do_bench_cudagraph``)
        whose arguments are all of :data:`OPTIONS` and whose ``quantiles`` and
        ``return_mode`` its result can be given in.
        """
        opts = self.options
        if self.state != "ran" or self.timed is None or self.benchmarker != "do_bench":
            return None
        if opts is None or any(name not in OPTIONS for name in opts):
            return None
        if opts.get("device_type", "cuda") != "cuda":
            return None
        try:
            _timing.check_return_mode(str(opts.get("return_mode", "mean")))
            _timing.quantiles_of([0.0], opts.get("quantiles") or ())
        except (TypeError, ValueError):
            return None
        return interleaved.Timed(
            self.timed,
            warmup_ms=float(opts.get("warmup", 25)),
            rep_ms=float(opts.get("rep", 100)),
            grad_to_none=opts.get("grad_to_none"),
        )

    def result(self, times: list[float]) -> Any:
        """``times`` (per-repetition ms) in the shape this ``do_bench`` call asked for."""
        opts = self.options or {}
        return _timing.summarize(times, opts.get("quantiles"), opts.get("return_mode", "mean"))


def priming() -> Priming | None:
    """The priming in progress on this thread (set by a step), else None.

    The patched ``do_bench`` (``implicit._primed_in_region``) reads it: when
    set, it runs Triton's first call only and returns :func:`placeholder`.
    """
    return getattr(_local, "priming", None)


def placeholder(kwargs: dict[str, Any]) -> Any:
    """An untimed result in ``do_bench``'s shape: NaN, or one NaN per quantile."""
    quantiles = kwargs.get("quantiles")
    return [math.nan] * len(quantiles) if quantiles else math.nan


def take_served() -> Any:
    """The result a step timed for this thread's next ``do_bench``, once; else :data:`NOT_SERVED`.

    The patched ``do_bench`` (``implicit._primed_in_region``) returns it
    without calling its ``fn``: the configuration was timed interleaved.  A
    list (quantiles, ``"all"``) is a copy, as each of Triton's calls returns
    a list of its own: a ``_bench`` served twice may change the first in place.
    """
    served = getattr(_local, "served", NOT_SERVED)
    _local.served = NOT_SERVED
    return list(served) if isinstance(served, list) else served


@contextlib.contextmanager
def _serving(result: Any) -> Iterator[None]:
    outer, _local.served = getattr(_local, "served", NOT_SERVED), result
    try:
        yield
    finally:
        _local.served = outer


@contextlib.contextmanager
def _priming() -> Iterator[Priming]:
    outer = priming()
    _local.priming = record = Priming()
    try:
        yield record
    finally:
        _local.priming = outer


def _steps() -> dict[int, Step]:
    steps: dict[int, Step] | None = getattr(_local, "steps", None)
    if steps is None:
        steps = _local.steps = {}
    return steps


def active(tuner: Any) -> Step | None:
    """The step ``tuner``'s ``run`` has open on this thread, once its configurations are known."""
    step = _steps().get(id(tuner))
    return step if step is not None and step.configs is not None else None


@dataclass
class Step:
    """One tuning step of one autotuner on one thread.

    1. ``run`` opens a step for its autotuner (this thread only);
    2. ``prune_configs`` names the step's configurations (not when the
       autotuner's class overrides it: then each configuration is timed in a
       region of its own, as with ``KREX_AUTOTUNE_REGION=config``);
    3. at the step's first ``_bench``, every configuration is *primed*
       outside the region: ``_bench`` runs with its benchmarker (a patched
       ``triton.testing.do_bench``) reduced to Triton's own first call,
       ``fn()`` and a device synchronization, which compiles it (or loads it
       from Triton's cache) while the siblings run, then returns untimed;
    4. the region is entered and, interleaved (the default, on a CUDA
       device), after the usual clock warm-up every configuration is timed
       in interleaved repetitions (``krex_client.interleaved``); each
       ``_bench`` of the step then runs in the region and its ``do_bench``
       returns that configuration's result without calling the kernel
       (:func:`take_served`).  Timed in turn instead (``sequential``, off a
       CUDA device, or a configuration primed through ``do_bench_cudagraph``
       or with arguments the interleaving does not honour), the warm-up runs
       its whole budget (``warmup.Policy.for_tuning_step``) and each
       ``_bench``'s ``do_bench`` times its configuration.  When a call
       raises during the interleaved loop, each ``_bench`` times its
       configuration in turn in the same region;
    5. the region is left after the step's last ``_bench`` (one per entry
       of the pruned list), or when ``run`` returns or raises.

    A configuration whose priming failed inside ``_bench`` (a compile error
    Triton turns into an infinite time) is not run again in the region: its
    ``_bench`` returns what the priming returned; an exception out of a
    priming ``_bench`` is raised again out of that configuration's own
    ``_bench``, not run again.  The region is entered at the first
    configuration with something to time: none when every one failed.  No
    priming when the autotuner times through a benchmarker krex did not
    patch, inside an explicit region, or once another thread of the process
    holds a region (checked before each priming).  Another autotuner's step
    started by a configuration's call primes and times its own
    configurations, in a region of its own while the outer step primes, in
    the outer step's region while it times; the same autotuner run again
    from within its own ``run`` once its step ended tunes its key in a step
    of its own.
    """

    configs: list[Any] | None = None
    calls: int = 0  # this step's _bench calls so far: Triton makes one per pruned entry
    finished: bool = False  # every one made: a later _bench is served or not the step's
    failed: dict[int, Any] = field(default_factory=dict)  # index -> priming _bench's result
    raised: dict[int, Exception] = field(default_factory=dict)  # index -> priming's exception
    primed: dict[int, Priming] = field(default_factory=dict)  # index -> priming that ran
    results: dict[int, Any] = field(default_factory=dict)  # index -> interleaved timing's result
    prime_tried: bool = False
    region: contextlib.ExitStack | None = None

    def bench(
        self,
        bench: Callable[..., Any],
        tuner: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        primed: bool,
    ) -> Any:
        """Run ``bench(tuner, *args, **kwargs)`` (one ``_bench``) as part of this step.

        Args:
            bench: the unpatched ``Autotuner._bench``.
            primed: True when its benchmarker is a patched ``do_bench``
                (step 3 of the class docstring primes only then).

        Returns:
            What ``_bench`` returns; for a configuration whose priming
            failed, what the priming ``_bench`` returned; after the step's
            last ``_bench``, a configuration timed interleaved gets its
            result again, with nothing run.

        Raises:
            ValueError: a configuration :meth:`covers` is False for.
            Exception: what this configuration's priming ``_bench`` raised
                (out of this configuration's call, as without priming), or
                what ``_bench`` raises.
        """
        from krex_client.region import region

        index = self._index(kwargs.get("config"))
        if index is None or (self.finished and index not in self.results):
            raise ValueError("not a configuration of this step (see Step.covers)")
        if self.finished:  # a _bench that times twice: the interleaved result again
            with _serving(self.results[index]):
                return bench(tuner, *args, **kwargs)
        if not self.prime_tried:
            self.prime_tried = True
            if primed:
                self._prime(bench, tuner, args, kwargs)
        try:
            if index in self.raised:
                raise self.raised[index]
            if index in self.failed:
                return self.failed[index]
            if self.region is None:  # at the first configuration that has something to time
                calls = self._interleavable(index)
                # In turn, the first configurations would run at the clock the warm-up left:
                # warm for the whole budget.  Interleaved, every one sees the same clocks.
                warm = warmup.Policy.for_tuning_step() if calls is None else None
                stack = contextlib.ExitStack()
                stack.enter_context(region.critical(warm=warm))
                self.region = stack  # not before: refused, the next _bench asks again
                self.results = self._time_interleaved(calls) if calls is not None else {}
            if index in self.results:
                with _serving(self.results[index]):
                    return bench(tuner, *args, **kwargs)
            return bench(tuner, *args, **kwargs)
        finally:
            self.calls += 1
            if self.calls >= len(self.configs or ()):
                self.finished = True
                self.close()

    def covers(self, kwargs: dict[str, Any]) -> bool:
        """True when a ``_bench(..., **kwargs)`` is this step's to run.

        False for a configuration the step did not prune (it runs as a single
        configuration's would), after the step's last ``_bench`` (one per
        entry of the pruned list) unless the configuration was timed
        interleaved (a ``_bench`` override that calls the base's twice gets
        its result again, with nothing run), and while an explicit region
        encloses the step (that region covers it whole, compiles included).
        """
        from krex_client.region import region

        index = self._index(kwargs.get("config"))
        if index is None:
            return False
        if self.finished:
            return index in self.results
        return self.region is not None or not region.inside()

    def close(self) -> None:
        """Leave the step's region, if one is open (idempotent)."""
        region, self.region = self.region, None
        if region is not None:
            region.close()

    def _index(self, config: Any) -> int | None:
        for i, candidate in enumerate(self.configs or ()):
            if candidate is config:
                return i
        return None

    def _interleavable(self, first: int) -> list[tuple[int, interleaved.Timed]] | None:
        """Configurations ``first`` onwards as an interleaved timing's entries; None: in turn.

        None when ``KREX_AUTOTUNE_ORDER=sequential``, off a CUDA device, or
        when any configuration left to time (not failed or raised in its
        priming) was not primed through a ``do_bench`` whose arguments an
        interleaved timing honours (:meth:`Priming.interleavable`).
        """
        if not interleaving() or _timing.device_backend() is None:
            return None
        entries = []
        for i, config in enumerate(self.configs or ()):
            if i < first or i in self.failed or i in self.raised or self._index(config) != i:
                continue
            timed = self.primed[i].interleavable() if i in self.primed else None
            if timed is None:
                return None
            entries.append((i, timed))
        return entries

    def _time_interleaved(self, entries: list[tuple[int, interleaved.Timed]]) -> dict[int, Any]:
        """Time ``entries`` interleaved (step 4′): ``{index: do_bench's result}``.

        {} when a configuration's call raised during the interleaved timing:
        then each ``_bench`` times its configuration by its own ``do_bench``,
        and the one that raised raises again there, as it would have.
        """
        backend = _timing.device_backend()
        if backend is None or not entries:
            return {}
        try:
            times = interleaved.time_interleaved(backend, [timed for _, timed in entries])
        except Exception:  # noqa: BLE001 - timed again in turn, where it raises as it would have
            with contextlib.suppress(Exception):
                backend.synchronize()
            return {}
        return {i: self.primed[i].result(t) for (i, _), t in zip(entries, times, strict=True)}

    def _prime(
        self, bench: Callable[..., Any], tuner: Any, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        from krex_client.region import region

        for i, config in enumerate(self.configs or ()):
            if region.busy():
                return  # another thread's region: the rest compile in this step's region
            if self._index(config) != i:
                continue  # pruned twice: primed once
            with _priming() as record:
                try:
                    result = bench(tuner, *args, **{**kwargs, "config": config})
                except Exception as exc:  # noqa: BLE001 - raised again from config's own _bench
                    self.raised[i] = exc
                    continue
            if record.state == "raised":  # _bench caught it: a configuration that cannot run
                self.failed[i] = result
            elif record.state == "ran":
                self.primed[i] = record


def wrap_run(run: Callable[..., Any]) -> Callable[..., Any]:
    """``Autotuner.run`` wrapped to open a step for its call (steps 1 and 5)."""
    if getattr(run, MARK, False):
        return run

    @functools.wraps(run)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        from krex_client.region import region

        steps = _steps()
        outer = steps.get(id(self))
        # Run again from within its own run: part of that step while it times, a step
        # of its own once it ended (the ended step's results are another key's).
        timing = outer is not None and not outer.finished
        if timing or not region.under_krex() or not step_scope():
            return run(self, *args, **kwargs)
        step = steps[id(self)] = Step()
        # Called while another step primes (a hook launching this autotuned kernel):
        # this step times its own configurations, so that priming does not apply here.
        outer_priming, _local.priming = priming(), None
        try:
            return run(self, *args, **kwargs)
        finally:
            _local.priming = outer_priming
            if outer is None:
                del steps[id(self)]
            else:
                steps[id(self)] = outer
            step.close()

    setattr(wrapper, MARK, True)
    return wrapper


def wrap_prune(prune: Callable[..., Any]) -> Callable[..., Any]:
    """``Autotuner.prune_configs`` wrapped to name the open step's configurations (step 2)."""
    if getattr(prune, MARK, False):
        return prune

    @functools.wraps(prune)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        configs = prune(self, *args, **kwargs)
        step = _steps().get(id(self))
        # A subclass's own prune_configs may keep part of what this one returns: the
        # step cannot know which configurations run, and leaves them one region each.
        own = getattr(getattr(type(self), "prune_configs", None), MARK, False)
        if own and step is not None and step.configs is None and isinstance(configs, (list, tuple)):
            step.configs = list(configs)
        return configs

    setattr(wrapper, MARK, True)
    return wrapper
