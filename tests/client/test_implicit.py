"""Auto-regions: Triton's and PyTorch's benchmarking run in regions without code changes.

Stub modules named ``triton.testing``, ``triton.runtime.autotuner`` and
``torch.utils.benchmark`` stand in for the real packages (which these
machines may lack); ``fake_krex`` counts the regions entered, and
``_event_log`` interleaves its requests with the timed function's calls to
show which calls ran outside a region (the priming call before each
``do_bench``'s region).  The lazy path
(patching at first import) runs in a fresh interpreter over stub packages on
disk; the real packages are checked where installed.
"""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
import textwrap
import threading
import time
import types
from pathlib import Path
from typing import Any

import pytest

from krex_client import implicit
from krex_client.region import region

from .conftest import FakeConnection

pytestmark = pytest.mark.usefixtures("clean_autoregion")

REPO = Path(__file__).resolve().parents[2]


def _install_stubs(monkeypatch: pytest.MonkeyPatch, conn: FakeConnection) -> dict[str, Any]:
    """Stub triton/torch benchmarking modules in sys.modules; each records if it ran in a region."""
    seen: list[tuple[str, bool]] = []
    testing_mod = types.ModuleType("triton.testing")

    def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None, return_mode="mean"):  # type: ignore[no-untyped-def]
        seen.append(("do_bench", conn.held))
        fn()
        return 1.0

    def do_bench_cudagraph(fn, rep=20, grad_to_none=None, quantiles=None, return_mode="mean"):  # type: ignore[no-untyped-def]
        seen.append(("do_bench_cudagraph", conn.held))
        fn()
        return 1.0

    testing_mod.do_bench = do_bench  # type: ignore[attr-defined]
    testing_mod.do_bench_cudagraph = do_bench_cudagraph  # type: ignore[attr-defined]

    class Autotuner:
        def __init__(self) -> None:
            # Triton 3.2+: the benchmarker is taken when the autotuner is built.
            self.do_bench = testing_mod.do_bench

        def _bench(self, *args: Any, config: str, **meta: Any) -> float:
            seen.append((f"_bench:{config}", conn.held))
            return float(self.do_bench(lambda: None, quantiles=(0.5, 0.2, 0.8)))

    autotuner_mod = types.ModuleType("triton.runtime.autotuner")
    autotuner_mod.Autotuner = Autotuner  # type: ignore[attr-defined]

    class Timer:
        def timeit(self, number: int = 1000000) -> str:
            seen.append(("timeit", conn.held))
            return "m"

        def blocked_autorange(self, callback: Any = None, min_run_time: float = 0.2) -> str:
            self.timeit(10)  # nested: joins the outer region
            return "m"

        def adaptive_autorange(self, threshold: float = 0.1, *, min_run_time: float = 0.01) -> str:
            seen.append(("adaptive_autorange", conn.held))
            return "m"

    benchmark_mod = types.ModuleType("torch.utils.benchmark")
    benchmark_mod.Timer = Timer  # type: ignore[attr-defined]
    for name, mod in (
        ("triton", types.ModuleType("triton")),
        ("triton.testing", testing_mod),
        ("triton.runtime", types.ModuleType("triton.runtime")),
        ("triton.runtime.autotuner", autotuner_mod),
        ("torch", types.ModuleType("torch")),
        ("torch.utils", types.ModuleType("torch.utils")),
        ("torch.utils.benchmark", benchmark_mod),
    ):
        monkeypatch.setitem(sys.modules, name, mod)
    return {
        "seen": seen,
        "testing": testing_mod,
        "originals": (do_bench, do_bench_cudagraph),
        "Autotuner": Autotuner,
        "Timer": Timer,
    }


def test_loaded_modules_patched_each_call_one_region(
    monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection
) -> None:
    stubs = _install_stubs(monkeypatch, fake_krex)
    tuner = stubs["Autotuner"]()  # built before autoregion(): holds the unpatched do_bench
    testing_mod = stubs["testing"]
    testing_mod.do_bench(lambda: None)
    assert fake_krex.regions == 0  # off until asked for

    implicit.autoregion()
    assert implicit.enabled()
    testing_mod.do_bench(lambda: None, 10, 50)
    testing_mod.do_bench_cudagraph(lambda: None)
    for config in ("BLOCK=64", "BLOCK=128"):
        tuner._bench(1, 2, config=config)
    timer = stubs["Timer"]()
    timer.timeit(5)
    timer.blocked_autorange()
    timer.adaptive_autorange(min_run_time=0.1)
    assert fake_krex.regions == 7
    assert all(held for _, held in stubs["seen"][1:]), stubs["seen"]


def test_nested_auto_and_explicit_regions_are_one(
    monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection
) -> None:
    stubs = _install_stubs(monkeypatch, fake_krex)
    implicit.autoregion()
    with region.critical():
        stubs["testing"].do_bench(lambda: stubs["testing"].do_bench_cudagraph(lambda: None))
        stubs["Autotuner"]()._bench(config="c")
    assert fake_krex.ops == ["region_enter", "region_exit"]


def test_patch_keeps_signature_and_is_idempotent(
    monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection
) -> None:
    stubs = _install_stubs(monkeypatch, fake_krex)
    do_bench, do_bench_cudagraph = stubs["originals"]
    implicit.autoregion()
    patched = stubs["testing"].do_bench
    implicit.autoregion()
    assert stubs["testing"].do_bench is patched
    assert patched.__wrapped__ is do_bench
    assert getattr(patched, implicit.MARK) is True
    assert inspect.signature(patched) == inspect.signature(do_bench)
    timeit = stubs["Timer"].__dict__["timeit"]
    assert timeit.__wrapped__.__name__ == "timeit"
    assert sum(isinstance(f, implicit._PostImportFinder) for f in sys.meta_path) == 1


def _event_log(monkeypatch: pytest.MonkeyPatch, conn: FakeConnection) -> list[str]:
    """One ordered list of the region requests and device synchronizations (``sync``)."""
    events: list[str] = []
    request = conn.request

    def logged(
        op: str, body: Any = None, timeout_s: float | None = None, *, forever: bool = False
    ) -> dict[str, Any]:
        events.append(op)
        return request(op, body, timeout_s, forever=forever)

    monkeypatch.setattr(conn, "request", logged)
    monkeypatch.setattr(implicit, "_synchronize", lambda: events.append("sync"), raising=False)
    return events


def _marker(events: list[str], conn: FakeConnection) -> Any:
    """``mark(name)`` appends ``name:in`` or ``name:out`` (whether a region is held)."""
    return lambda name: events.append(f"{name}:{'in' if conn.held else 'out'}")


PRIMED = ["fn:out", "sync", "region_enter", "fn:in", "region_exit"]
"""A primed do_bench: the first call and a synchronization outside, the stub's call inside."""


def test_do_bench_primes_outside_its_region(
    monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection
) -> None:
    stubs = _install_stubs(monkeypatch, fake_krex)
    events = _event_log(monkeypatch, fake_krex)
    mark = _marker(events, fake_krex)
    implicit.autoregion()
    testing_mod = stubs["testing"]
    assert testing_mod.do_bench(lambda: mark("fn"), 10, rep=50) == 1.0
    assert events == PRIMED
    events.clear()
    testing_mod.do_bench_cudagraph(fn=lambda: mark("fn"))
    assert events == PRIMED
    # Off krex the region is a no-op: nothing is primed, fn runs as often as without krex.
    events.clear()
    monkeypatch.delenv("KREX_SOCKET")
    with pytest.warns(RuntimeWarning, match="not running under"):
        testing_mod.do_bench(lambda: mark("fn"))
    assert events == ["fn:out"]


def test_priming_call_that_raises_propagates_with_no_region(
    monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection
) -> None:
    stubs = _install_stubs(monkeypatch, fake_krex)
    events = _event_log(monkeypatch, fake_krex)
    implicit.autoregion()
    failure = RuntimeError("out of resources")

    def fn() -> None:
        events.append("fn")
        raise failure

    with pytest.raises(RuntimeError) as caught:
        stubs["testing"].do_bench(fn, quantiles=(0.5,))
    assert caught.value is failure
    assert events == ["fn"]  # no synchronization, no region
    assert stubs["seen"] == []  # Triton's do_bench never ran
    # Arguments that do not bind are left to the original, in its region: no first call.
    with pytest.raises(TypeError):
        stubs["testing"].do_bench(fn, 1, 2, 3, 4, 5, 6)
    assert events == ["fn", "region_enter", "region_exit"]


AUTOTUNER_MODULE = textwrap.dedent(
    """
    import functools
    # Triton 3.0/3.1: the autotuner module binds these names when it is imported.
    from triton.testing import do_bench, do_bench_cudagraph

    class Autotuner:
        def __init__(self, kernel, mark, style):
            self.kernel, self.mark = kernel, mark
            self.use_cuda_graph = style == "3.0-cudagraph"
            if style == "3.2":  # the benchmarker taken when the autotuner is built
                from triton.testing import do_bench as benchmarker
                self.do_bench = benchmarker
            elif style == "own":  # a do_bench of the script's own
                self.do_bench = lambda fn, quantiles: fn()

        def _bench(self, *args, config, **meta):
            self.mark("_bench")
            timer = getattr(self, "do_bench", None)
            if timer is not None:
                return timer(self.kernel, quantiles=(0.5, 0.2, 0.8))
            if self.use_cuda_graph:
                return do_bench_cudagraph(self.kernel)
            return do_bench(self.kernel, quantiles=(0.5, 0.2, 0.8))

    class LazyAutotuner(Autotuner):
        # Triton 3.4+: a cached property, read at the first _bench.
        @functools.cached_property
        def do_bench(self):
            from triton.testing import do_bench as benchmarker
            return benchmarker
    """
)


def _install_autotuner(monkeypatch: pytest.MonkeyPatch) -> types.ModuleType:
    """A ``triton.runtime.autotuner`` stand-in (:data:`AUTOTUNER_MODULE`) over the stubs."""
    mod = types.ModuleType("triton.runtime.autotuner")
    exec(AUTOTUNER_MODULE, mod.__dict__)  # noqa: S102 - the test's own source
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod


def test_autotuner_timing_through_a_primed_do_bench_has_no_outer_region(
    monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection
) -> None:
    _install_stubs(monkeypatch, fake_krex)
    mod = _install_autotuner(monkeypatch)
    events = _event_log(monkeypatch, fake_krex)
    mark = _marker(events, fake_krex)
    kernel = lambda: mark("fn")  # noqa: E731
    early = mod.Autotuner(kernel, mark, "3.2")  # holds the unpatched do_bench
    lazy = mod.LazyAutotuner(kernel, mark, "lazy")  # reads it at its first _bench
    implicit.autoregion()  # triton.testing and the autotuner module already loaded
    primed = ["_bench:out", *PRIMED]
    whole = ["region_enter", "_bench:in", "fn:in", "region_exit"]
    cases = [
        (mod.Autotuner(kernel, mark, "3.2"), primed),
        (lazy, primed),
        (mod.Autotuner(kernel, mark, "3.0"), primed),
        (mod.Autotuner(kernel, mark, "3.0-cudagraph"), primed),
        (early, whole),
        (mod.Autotuner(kernel, mark, "own"), whole),
    ]
    for tuner, expected in cases:
        events.clear()
        tuner._bench(1, config="BLOCK=64")
        assert events == expected, (tuner.__dict__, events)


def test_no_priming_inside_an_explicit_region(
    monkeypatch: pytest.MonkeyPatch, fake_krex: FakeConnection
) -> None:
    stubs = _install_stubs(monkeypatch, fake_krex)
    mod = _install_autotuner(monkeypatch)
    events = _event_log(monkeypatch, fake_krex)
    mark = _marker(events, fake_krex)
    implicit.autoregion()
    testing_mod, kernel = stubs["testing"], lambda: mark("fn")
    testing_mod.do_bench(kernel)
    assert events == PRIMED
    events.clear()
    assert not region.inside()
    with region.critical():
        assert region.inside()
        testing_mod.do_bench(kernel)
        testing_mod.do_bench_cudagraph(kernel)
        mod.Autotuner(kernel, mark, "3.2")._bench(config="c")
        mod.Autotuner(kernel, mark, "3.0")._bench(config="c")
    assert events == ["region_enter", "fn:in", "fn:in", "_bench:in", "fn:in"] + [
        "_bench:in",
        "fn:in",
        "region_exit",
    ]
    # Another thread's region: no first call alongside its timed code; wait for it.
    events.clear()
    entered, release = threading.Event(), threading.Event()

    def holder() -> None:
        with region.critical():
            entered.set()
            release.wait(10)

    other = threading.Thread(target=holder)
    other.start()
    assert entered.wait(10)
    bench = threading.Thread(target=testing_mod.do_bench, args=(kernel,))
    bench.start()
    time.sleep(0.2)  # time enough for a first call, had it been made
    release.set()
    other.join(10)
    bench.join(10)
    assert events == ["region_enter", "region_exit", "region_enter", "fn:in", "region_exit"]


def test_synchronize_waits_through_triton_else_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    synced: list[str] = []

    class DeviceInterface:
        @staticmethod
        def synchronize() -> None:
            synced.append("triton")

    runtime = types.ModuleType("triton.runtime")
    runtime.driver = types.SimpleNamespace(  # type: ignore[attr-defined]
        active=types.SimpleNamespace(get_device_interface=lambda: DeviceInterface)
    )
    cuda = types.SimpleNamespace(
        is_initialized=lambda: True, synchronize=lambda: synced.append("torch")
    )
    torch = types.ModuleType("torch")
    torch.cuda = cuda  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "triton.runtime", runtime)
    monkeypatch.setitem(sys.modules, "torch", torch)
    implicit._synchronize()
    assert synced == ["triton"]
    monkeypatch.setitem(sys.modules, "triton.runtime", types.ModuleType("triton.runtime"))
    implicit._synchronize()  # Triton 3.0: no device interface on the driver
    assert synced == ["triton", "torch"]
    cuda.is_initialized = lambda: False  # never initializes CUDA itself
    implicit._synchronize()
    monkeypatch.delitem(sys.modules, "torch")
    monkeypatch.delitem(sys.modules, "triton.runtime")
    implicit._synchronize()
    assert synced == ["triton", "torch"]


def test_env_variable_values() -> None:
    on = ("1", "true", "YES", " on ")
    assert all(implicit.env_requests_autoregion({"KREX_AUTOREGION": v}) for v in on)
    off = ("", "0", "no", "false")
    assert not any(implicit.env_requests_autoregion({"KREX_AUTOREGION": v}) for v in off)
    assert not implicit.env_requests_autoregion({})


STUB_FILES = {
    "triton/__init__.py": "from . import testing\nfrom .runtime import autotuner\n",
    "triton/testing.py": "def do_bench(fn, warmup=25, rep=100, grad_to_none=None, quantiles=None,"
    " return_mode='mean'):\n    return fn()\n\n"
    "def do_bench_cudagraph(fn, rep=20, grad_to_none=None, quantiles=None, return_mode='mean'):\n"
    "    return fn()\n",
    "triton/runtime/__init__.py": "",
    "triton/runtime/autotuner.py": "class Autotuner:\n"
    "    def __init__(self):\n        from triton.testing import do_bench\n"
    "        self.do_bench = do_bench\n"
    "    def _bench(self, fn, config=None):\n        return self.do_bench(fn)\n",
    "torch/__init__.py": "",
    "torch/utils/__init__.py": "",
    "torch/utils/benchmark/__init__.py": "from .utils.timer import Timer\n",
    "torch/utils/benchmark/utils/__init__.py": "",
    "torch/utils/benchmark/utils/timer.py": "class Timer:\n"
    "    def __init__(self, fn):\n        self.fn = fn\n"
    "    def timeit(self, number=1000000):\n        return self.fn()\n"
    "    def blocked_autorange(self, callback=None, min_run_time=0.2):\n"
    "        return self.timeit(2)\n",
}

# Run in a fresh interpreter: reports what was imported and in which region each call ran.
PROBE = textwrap.dedent(
    """
    import json, sys
    import krex_client
    from krex_client.region import region
    report = {"early": sorted(m for m in ("triton", "torch", "zmq", "msgpack") if m in sys.modules)}

    class Conn:
        held = False
        ops = []
        def request(self, op, body=None, timeout_s=None, *, forever=False):
            self.ops.append(op)
            self.held = op == "region_enter"
            return {"epoch": 1}

    conn = Conn()
    region.connect = lambda: conn
    import triton.testing
    from torch.utils.benchmark import Timer
    from triton.runtime.autotuner import Autotuner
    held = lambda: conn.held
    report["calls"] = [
        triton.testing.do_bench(held),
        triton.testing.do_bench_cudagraph(held),
        Autotuner()._bench(held, config="c"),
        Timer(held).timeit(3),
        Timer(held).blocked_autorange(),
    ]
    report["regions"] = conn.ops.count("region_enter")
    print(json.dumps(report))
    """
)


def _run_probe(tmp_path: Path, autoregion: str | None) -> dict[str, Any]:
    for rel, text in STUB_FILES.items():
        path = tmp_path / "stubs" / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
    env.update(KREX_SOCKET="/nonexistent.sock", KREX_TENANT="3", KREX_TOKEN="t")
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path / "stubs"), str(REPO / "python_client")])
    if autoregion is not None:
        env["KREX_AUTOREGION"] = autoregion
    res = subprocess.run(
        [sys.executable, "-c", PROBE], env=env, capture_output=True, text=True, timeout=60
    )
    assert res.returncode == 0, res.stderr
    report: dict[str, Any] = json.loads(res.stdout)
    return report


def test_env_patches_modules_at_their_first_import(tmp_path: Path) -> None:
    report = _run_probe(tmp_path, "1")
    assert report["early"] == []  # importing krex_client imported none of them
    assert report["calls"] == [True] * 5
    assert report["regions"] == 5


def test_without_env_nothing_is_patched(tmp_path: Path) -> None:
    report = _run_probe(tmp_path, None)
    assert report["calls"] == [False] * 5 and report["regions"] == 0
    assert _run_probe(tmp_path, "0")["regions"] == 0


REAL_PROBE = textwrap.dedent(
    """
    import importlib.util, json, sys
    import krex_client
    krex_client.autoregion()
    marks = {}
    if importlib.util.find_spec("torch") is not None:
        from torch.utils.benchmark import Timer
        for name in ("timeit", "blocked_autorange", "adaptive_autorange"):
            marks["Timer." + name] = getattr(getattr(Timer, name), "__krex_autoregion__", False)
    if importlib.util.find_spec("triton") is not None:
        import triton.testing, triton.runtime.autotuner
        marks["do_bench"] = getattr(triton.testing.do_bench, "__krex_autoregion__", False)
        marks["do_bench_cudagraph"] = getattr(
            triton.testing.do_bench_cudagraph, "__krex_autoregion__", False)
        for name in ("_bench", "run", "prune_configs"):
            marks["Autotuner." + name] = getattr(
                getattr(triton.runtime.autotuner.Autotuner, name), "__krex_autoregion__", False)
    print(json.dumps(marks))
    """
)


def test_real_packages_are_patched() -> None:
    import importlib.util

    if importlib.util.find_spec("torch") is None and importlib.util.find_spec("triton") is None:
        pytest.skip("neither torch nor triton is installed")
    res = subprocess.run(
        [sys.executable, "-c", REAL_PROBE], capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    marks = json.loads(res.stdout)
    assert marks and all(marks.values()), marks
