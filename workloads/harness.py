"""Shared harness of the benchmarking corpus: one command = one (task, candidate).

A family script (``workloads/<family>.py``) declares its tasks as data and a
``build(task, candidate)`` function; ``main()`` does the rest the way kernel
agents' benchmarking commands do (paper §2.1): import the framework, create
the GPU context, build the candidate and its inputs, check it against the
reference, then time it with ``krex_client.do_bench`` inside
``region.critical()`` (warm-up inside the region, L2 flushed before every
repetition) and print one JSON result line:

    {"family", "task", "candidate", "median_ms", "mean_ms", "min_ms", "reps",
     "correct", "max_abs_err", "device", "seed", "phases": {...}, "t_print"}

``--smoke`` runs the task at its small ``smoke`` shape and times a few
calls without krex (on ``--device cpu`` Triton kernels need
``TRITON_INTERPRET=1``; candidates that need CUDA exit 4, unsupported):
a quick check of every candidate's code path, not a measurement.

``phases`` (ms): admit_ms (``KREX_ADMIT_MS`` from ``krex run``; absent
natively), imports_ms (process start to frameworks imported), context_ms
(first GPU call: CUDA context creation), build_ms (inputs, candidate,
compilation and first call), correctness_ms, region_wait_ms (request to
grant of the region), drain_ms and freeze_ms (parts of that wait),
in_region_ms (inside the region), krex_region_ms (krexd's view of it).
``t_print`` is the wall-clock time of printing (s), so the replay can add
exit_ms.  ``--list`` prints the family's tasks without importing any GPU
framework.  Exit codes: 0 measured (even when incorrect: see "correct"),
2 bad arguments, 4 candidate unsupported on this device (smoke runs), 1
anything else (traceback on stderr).
"""

from __future__ import annotations

import time

T_IMPORT = time.time()  # the harness is imported first: close to process start

import argparse  # noqa: E402
import importlib  # noqa: E402
import json  # noqa: E402
import os  # noqa: E402
import random  # noqa: E402
import statistics  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from dataclasses import dataclass, field  # noqa: E402
from typing import Any  # noqa: E402

BANDS = ("<0.1ms", "0.1-1ms", "1-10ms", ">=10ms")
EXIT_UNSUPPORTED = 4
COMPARE_CHUNK = 1 << 24  # elements per step of the correctness check


class Unsupported(Exception):
    """The candidate cannot run on this device (e.g. CuPy or a CUDA extension on CPU)."""


@dataclass(frozen=True)
class Task:
    """A benchmarking task: one operation, one shape, several candidates.

    name: task id; band: expected kernel-duration band (``BANDS``);
    candidates: candidate ids; params: shapes and dtypes for ``build``;
    rtol, atol: correctness tolerances; warmup_ms, rep_ms: do_bench budgets
    (ms); about: what the task models; smoke: params overridden for --smoke
    (a small shape).
    """

    name: str
    band: str
    candidates: tuple[str, ...]
    params: dict[str, Any] = field(default_factory=dict)
    rtol: float = 1e-2
    atol: float = 1e-2
    warmup_ms: float = 25.0
    rep_ms: float = 100.0
    about: str = ""
    smoke: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.band not in BANDS:
            raise ValueError(f"task {self.name}: band {self.band!r} not in {BANDS}")
        if len(self.candidates) < 3 or len(set(self.candidates)) != len(self.candidates):
            raise ValueError(f"task {self.name}: needs >= 3 distinct candidates")


@dataclass
class Bench:
    """What ``build`` returns.

    fn: the timed call (launches the candidate on the current stream and
    returns its output); reference: computes the expected output;
    check: optional ``(out, ref) -> (correct, max_abs_err)`` replacing the
    default allclose comparison (for outputs whose order may legally differ).
    """

    fn: Callable[[], Any]
    reference: Callable[[], Any]
    check: Callable[[Any, Any], tuple[bool, float]] | None = None


@dataclass(frozen=True)
class Case:
    """What a builder builds: task, candidate, params p (smoke shape applied), device."""

    task: Task
    candidate: str
    p: dict[str, Any]
    device: str

    @property
    def on_cuda(self) -> bool:
        return self.device.startswith("cuda")

    def need_cuda(self) -> None:
        """Raise Unsupported when not on a CUDA device (CuPy, CUDA sources, cuDNN choices)."""
        if not self.on_cuda:
            raise Unsupported(f"{self.candidate} needs a CUDA device")


Builder = Callable[[Case], Bench]


def process_start() -> float:
    """Wall-clock start time of this process (s); the harness import time if unknown."""
    try:
        import psutil

        return float(psutil.Process().create_time())
    except Exception:
        return T_IMPORT


def listing(family: str, tasks: Sequence[Task]) -> dict[str, Any]:
    """The ``--list`` document: family, and per task its band, candidates and about."""
    return {
        "family": family,
        "tasks": [
            {"task": t.name, "band": t.band, "candidates": list(t.candidates), "about": t.about}
            for t in tasks
        ],
    }


def parse_args(
    family: str, tasks: Sequence[Task], argv: Sequence[str] | None
) -> argparse.Namespace:
    """Parse a family script's arguments (exits 2 with a message on bad input)."""
    p = argparse.ArgumentParser(prog=f"{family}.py", description=f"{family} benchmarking commands")
    p.add_argument("--list", action="store_true", help="print tasks and candidates (JSON)")
    p.add_argument("--task", choices=[t.name for t in tasks])
    p.add_argument("--candidate")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--warmup-ms", type=float, default=None, help="override do_bench warm-up")
    p.add_argument("--rep-ms", type=float, default=None, help="override do_bench budget")
    p.add_argument(
        "--smoke",
        action="store_true",
        help="small shape, no region, a few timed calls: checks the code path",
    )
    p.add_argument("--device", default="cuda", help="device (cpu only with --smoke)")
    a = p.parse_args(argv)
    if a.list:
        return a
    if a.task is None or a.candidate is None:
        p.error("--task and --candidate are required (see --list)")
    if a.device != "cuda" and not a.smoke:
        p.error("--device other than cuda needs --smoke (timing uses CUDA events)")
    task = next(t for t in tasks if t.name == a.task)
    if a.candidate not in task.candidates:
        p.error(
            f"task {task.name} has no candidate {a.candidate!r}; "
            f"choose from {', '.join(task.candidates)}"
        )
    return a


def compare(out: Any, ref: Any, rtol: float, atol: float) -> tuple[bool, float]:
    """Default correctness check: allclose for floats, exact for integers.

    Args:
        out, ref: tensors, or equally long tuples/lists of tensors.
    Returns: (correct, largest absolute error).
    """
    import torch

    if isinstance(ref, tuple | list):
        if not isinstance(out, tuple | list) or len(out) != len(ref):
            return False, float("inf")
        results = [compare(o, r, rtol, atol) for o, r in zip(out, ref, strict=True)]
        return all(ok for ok, _ in results), max(err for _, err in results)
    if not isinstance(out, torch.Tensor) or out.shape != ref.shape:
        return False, float("inf")
    # Chunks of COMPARE_CHUNK elements: the check's temporaries stay small, so that
    # many commands sharing a GPU do not run out of memory in their correctness phase.
    o_flat, r_flat = out.reshape(-1), ref.reshape(-1)
    exact = not ref.is_floating_point()
    ok, err = True, 0.0
    for i in range(0, r_flat.numel(), COMPARE_CHUNK):
        if exact:
            o = o_flat[i : i + COMPARE_CHUNK].to(torch.int64)
            r = r_flat[i : i + COMPARE_CHUNK].to(torch.int64)
            err = max(err, float((o - r).abs().max().item()))
            ok = ok and err == 0.0
            continue
        o = o_flat[i : i + COMPARE_CHUNK].float()
        r = r_flat[i : i + COMPARE_CHUNK].float()
        if not bool(torch.isfinite(o).all().item()):
            return False, float("inf")
        err = max(err, float((o - r).abs().max().item()))
        ok = ok and bool(torch.allclose(o, r, rtol=rtol, atol=atol))
    return ok, err


def seed_all(seed: int) -> None:
    """Seed Python's, NumPy's (when present) and PyTorch's generators."""
    import torch

    random.seed(seed)
    try:
        import numpy as np

        np.random.seed(seed)
    except ImportError:
        pass
    torch.manual_seed(seed)
    torch.cuda.manual_seed_all(seed)


def _sync(torch: Any, device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def smoke(case: Case, bench: Bench, torch: Any) -> dict[str, Any]:
    """--smoke: check correctness and time three calls with the wall clock (ms)."""
    out = bench.fn()
    ref = bench.reference()
    check = bench.check or (lambda o, r: compare(o, r, case.task.rtol, case.task.atol))
    correct, err = check(out, ref)
    times = []
    for _ in range(3):
        t0 = time.perf_counter()
        bench.fn()
        _sync(torch, case.device)
        times.append((time.perf_counter() - t0) * 1e3)
    return {
        "smoke": True,
        "device": case.device,
        "correct": correct,
        "max_abs_err": err if err != float("inf") else None,
        "median_wall_ms": statistics.median(times),
    }


def main(
    family: str,
    tasks: Sequence[Task],
    build: Builder,
    frameworks: Sequence[str] = ("torch",),
    argv: Sequence[str] | None = None,
) -> int:
    """Run one benchmarking command of a family; returns the exit code.

    Args:
        family: the script's family name; tasks: its tasks; build: the
            candidate builder; frameworks: modules imported during the
            imports phase (e.g. "torch", "triton"); argv: arguments
            (default sys.argv[1:]).
    """
    a = parse_args(family, tasks, argv)
    if a.list:
        print(json.dumps(listing(family, tasks)))
        return 0
    task = next(t for t in tasks if t.name == a.task)
    params = {**task.params, **task.smoke} if a.smoke else dict(task.params)
    case = Case(task, a.candidate, params, a.device)
    t_start = process_start()

    # One in-process compile thread: inductor's worker pool costs seconds to start
    # and to shut down at exit in every command, unrelated to the candidate.
    os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    for mod in frameworks:  # imports phase (paper §2.1: start-up)
        if mod == "cupy" and a.device != "cuda":
            continue
        try:
            importlib.import_module(mod)
        except ImportError:
            if mod == "torch":
                raise
            # Optional framework missing: only its own candidates fail, at build.
            print(f"{family}.py: {mod} is not installed", file=sys.stderr)
    import torch

    t_imports = time.time()
    if a.smoke:
        seed_all(a.seed)
        try:
            bench = build(case)
            res = smoke(case, bench, torch)
        except Unsupported as exc:
            print(f"{family}.py: unsupported here: {exc}", file=sys.stderr)
            return EXIT_UNSUPPORTED
        print(json.dumps({"family": family, "task": task.name, "candidate": a.candidate, **res}))
        return 0

    from krex_client import do_bench, region

    torch.cuda.init()  # first GPU call: context creation
    torch.empty(1, device="cuda")
    torch.cuda.synchronize()
    t_context = time.time()

    seed_all(a.seed)
    bench = build(case)
    out = bench.fn()  # first call: JIT compilation of Triton / torch.compile candidates
    torch.cuda.synchronize()
    t_build = time.time()

    ref = bench.reference()
    torch.cuda.synchronize()
    if bench.check is not None:
        correct, err = bench.check(out, ref)
    else:
        correct, err = compare(out, ref, task.rtol, task.atol)
    del out, ref
    t_checked = time.time()

    warmup_ms = a.warmup_ms if a.warmup_ms is not None else task.warmup_ms
    rep_ms = a.rep_ms if a.rep_ms is not None else task.rep_ms
    t_ask = time.time()
    with region.critical():  # the timing phase, warm-up included, runs alone
        t_in = time.time()
        times = do_bench(bench.fn, warmup_ms=warmup_ms, rep_ms=rep_ms, return_mode="all")
        t_out = time.time()
    st = region.stats()
    assert isinstance(times, list) and times, "do_bench returned no repetition"

    phases: dict[str, float] = {
        "imports_ms": (t_imports - t_start) * 1e3,
        "context_ms": (t_context - t_imports) * 1e3,
        "build_ms": (t_build - t_context) * 1e3,
        "correctness_ms": (t_checked - t_build) * 1e3,
        "region_wait_ms": float(st.get("entry_ms", 0.0)) or (t_in - t_ask) * 1e3,
        "drain_ms": float(st.get("drain_ms", 0.0)),
        "freeze_ms": float(st.get("freeze_ms", 0.0)),
        "in_region_ms": (t_out - t_in) * 1e3,
        "krex_region_ms": float(st.get("region_ms", 0.0)),
    }
    admit = os.environ.get("KREX_ADMIT_MS")
    if admit:
        try:
            phases["admit_ms"] = float(admit)
        except ValueError:
            pass
    result = {
        "family": family,
        "task": task.name,
        "candidate": a.candidate,
        "median_ms": float(statistics.median(times)),
        "mean_ms": float(statistics.fmean(times)),
        "min_ms": float(min(times)),
        "reps": len(times),
        "correct": correct,
        "max_abs_err": err if err != float("inf") else None,
        "device": torch.cuda.get_device_name(),
        "seed": a.seed,
        "phases": phases,
    }
    result["t_print"] = time.time()
    print(json.dumps(result), flush=True)
    return 0


def run(
    family: str, tasks: Sequence[Task], build: Builder, frameworks: Sequence[str] = ("torch",)
) -> None:
    """``main()`` as a script's entry point: exits with its code."""
    sys.exit(main(family, tasks, build, frameworks))
