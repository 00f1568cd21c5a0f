"""Run a trace in one mode and record every command (``results.jsonl``, ``meta.json``).

Workers pull commands in trace order from one shared queue, so a task's
candidates stay interleaved with other tasks as in the agents' trajectories.
native: one worker per GPU (``CUDA_VISIBLE_DEVICES`` set, no krex).
serial/krex/ungated: ``concurrency`` workers per GPU, each command run as
``krex run [--gpu G] -- ARGV`` against the replay's krexd (paper §6.1).

Each command's record (one JSON line, written as soon as it ends):
``seq, pass, index, argv, task, candidate, band, mode, worker, gpu, start,
end (wall clock s), wall_s, exit_code, result (the command's JSON result
line or null), stderr_tail (on failure), error (on failure)``, and
``gpu_fault`` (``{role, reruns}``, ``krex_cli.casualty.summary``) when
``krex run`` met a GPU-wide fault under MPS.
"""

from __future__ import annotations

import json
import math
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

from krex_cli import casualty
from krex_cli.replay import modes, regions
from krex_cli.replay.trace import TraceEntry

STDERR_TAIL_CHARS = 4000
RESULTS = "results.jsonl"
META = "meta.json"


EX_TEMPFAIL = 75
"""``krex run``'s exit code when co-tenants' GPU memory failed the command."""
TEMPFAIL_RETRIES = 2


@dataclass
class RunOptions:
    """What one replay runs.

    trace: the commands; trace_path: where they came from; mode: how to run;
    out: output directory; gpus: GPU indices to use; pin_gpus: pass
    ``--gpu`` to ``krex run`` (when the GPUs were named explicitly);
    duration_s: loop the trace until this many seconds are spent (None: no
    loop); repeat: passes over the trace (None: 1, or unbounded with
    duration_s; with duration_s an upper bound);
    python: interpreter substituted for argv[0] "python"/"python3"; cwd:
    commands' working directory; timeout_s: per-command limit (s);
    socket: a running krexd to use instead of starting one; fake_gpus: pass
    ``--fake-gpus N`` to the started krexd; base_config: krexd config the
    mode overrides; progress: show a progress bar.
    """

    trace: Sequence[TraceEntry]
    trace_path: Path
    mode: modes.Mode
    out: Path
    gpus: Sequence[int]
    pin_gpus: bool = False
    duration_s: float | None = None
    repeat: int | None = None
    python: str = sys.executable
    cwd: Path = field(default_factory=Path.cwd)
    timeout_s: float = 600.0
    socket: str | None = None
    fake_gpus: int | None = None
    base_config: Path | None = None
    progress: bool = True


def parse_result(stdout: str) -> dict[str, Any] | None:
    """The command's result: the last stdout line that is a JSON object with "median_ms"."""
    for line in reversed(stdout.splitlines()):
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(obj, dict) and "median_ms" in obj:
            return obj
    return None


def resolve_argv(argv: Sequence[str], python: str) -> list[str]:
    """argv with a leading "python"/"python3" replaced by ``python``."""
    out = list(argv)
    if out[0] in ("python", "python3"):
        out[0] = python
    return out


class _Schedule:
    """Thread-safe source of (pass, index, entry) in trace order, looping as asked."""

    def __init__(self, trace: Sequence[TraceEntry], repeat: int, deadline: float | None) -> None:
        self._it: Iterator[tuple[int, int, TraceEntry]] = (
            (p, i, e) for p in range(repeat) for i, e in enumerate(trace)
        )
        self._deadline = deadline
        self._lock = threading.Lock()
        self.stopped = threading.Event()

    def next(self) -> tuple[int, int, TraceEntry] | None:
        with self._lock:
            if self.stopped.is_set():
                return None
            if self._deadline is not None and time.monotonic() >= self._deadline:
                return None
            return next(self._it, None)


class Runner:
    """Runs one replay; ``run()`` returns the results path."""

    def __init__(self, opts: RunOptions) -> None:
        if opts.repeat is not None and opts.repeat < 1:
            raise modes.ModeError(f"--repeat must be >= 1, got {opts.repeat}")
        if not opts.gpus:
            raise modes.ModeError("no GPU to run on")
        self.opts = opts
        self._lock = threading.Lock()
        self._seq = 0
        self._children: set[subprocess.Popen[str]] = set()
        self._results: IO[str] | None = None
        self._bar: Any = None
        self._failed = 0
        self._logs: dict[tuple[int, int], int] = {}  # region logs per (pass, index)

    # --- one command ---------------------------------------------------------------------
    def _command(
        self, entry: TraceEntry, gpu: int, socket: str | None
    ) -> tuple[list[str], dict[str, str]]:
        argv = resolve_argv(entry.argv, self.opts.python)
        base = {k: v for k, v in os.environ.items() if not k.startswith("KREX_")}
        env = modes.command_env(base, modes.package_pythonpath())
        if not self.opts.mode.uses_krexd:
            env["CUDA_VISIBLE_DEVICES"] = str(gpu)
            return argv, env
        assert socket is not None
        env["KREX_SOCKET"] = socket
        pin = ["--gpu", str(gpu)] if self.opts.pin_gpus else []
        mem = entry.extra.get("mem")  # the command's declared GPU memory need, e.g. "8G"
        if isinstance(mem, str) and mem:
            pin += ["--mem", mem]
        return modes.krex_command() + ["run", *pin, "--", *argv], env

    def _run_one(
        self, worker: int, gpu: int, socket: str | None, p: int, i: int, entry: TraceEntry
    ) -> dict[str, Any]:
        """Run one command; retry it when ``krex run`` says co-tenants' memory failed it.

        Exit 75 (EX_TEMPFAIL, docs/design/memory.md) is not the candidate's
        fault, so a harness retries instead of recording a failure; at most
        :data:`TEMPFAIL_RETRIES` times.  ``retries`` in the record counts them.
        """
        retries = 0
        while True:
            rec = self._attempt(worker, gpu, socket, p, i, entry)
            tempfail = self.opts.mode.uses_krexd and rec.get("exit_code") == EX_TEMPFAIL
            if not tempfail or retries == TEMPFAIL_RETRIES:
                break
            retries += 1
        rec["retries"] = retries
        return rec

    def _attempt(
        self, worker: int, gpu: int, socket: str | None, p: int, i: int, entry: TraceEntry
    ) -> dict[str, Any]:
        argv, env = self._command(entry, gpu, socket)
        log = self._region_log(p, i) if self.opts.mode.uses_krexd else None
        if log is not None:
            env["KREX_REGION_LOG"] = os.path.abspath(self.opts.out / log)
        rec: dict[str, Any] = {
            "pass": p,
            "index": i,
            "argv": list(entry.argv),
            "task": entry.task,
            "candidate": entry.candidate,
            "band": entry.band,
            "mode": self.opts.mode.name,
            "concurrency": self.opts.mode.concurrency,
            "worker": worker,
            "gpu": gpu,
        }
        if log is not None:
            rec["region_log"] = log
        rec["start"] = time.time()
        t0 = time.monotonic()
        error: str | None = None
        try:
            proc = subprocess.Popen(
                argv,
                cwd=self.opts.cwd,
                env=env,
                text=True,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as exc:
            rec.update(
                end=time.time(),
                wall_s=time.monotonic() - t0,
                exit_code=None,
                result=None,
                stderr_tail="",
                error=f"cannot start: {exc}",
            )
            return rec
        with self._lock:
            self._children.add(proc)
        try:
            out, err = proc.communicate(timeout=self.opts.timeout_s)
        except subprocess.TimeoutExpired:
            _kill_group(proc, signal.SIGKILL)
            out, err = proc.communicate()
            error = f"timed out after {self.opts.timeout_s:g} s"
        finally:
            with self._lock:
                self._children.discard(proc)
        rec["end"] = time.time()
        rec["wall_s"] = time.monotonic() - t0
        rec["exit_code"] = proc.returncode
        result = parse_result(out)
        if result is not None:
            phases = result.get("phases")
            t_print = result.get("t_print")
            if isinstance(phases, dict) and isinstance(t_print, int | float):
                phases["exit_ms"] = max(0.0, (rec["end"] - t_print) * 1000.0)
        rec["result"] = result
        fault = casualty.summary(err, proc.returncode)  # krex run's re-runs after GPU-wide faults
        if fault is not None:
            rec["gpu_fault"] = fault
        if error is None and proc.returncode != 0:
            error = f"exit code {proc.returncode}"
        if error is None and result is None:
            error = "no JSON result line on stdout"
        if error is not None:
            rec["error"] = error
            rec["stderr_tail"] = err[-STDERR_TAIL_CHARS:]
        return rec

    def _region_log(self, p: int, i: int) -> str:
        """A fresh region log (relative to the run) for one attempt of line ``i`` in pass ``p``."""
        with self._lock:
            n = self._logs[(p, i)] = self._logs.get((p, i), 0) + 1
        (self.opts.out / regions.DIR).mkdir(exist_ok=True)
        return regions.log_name(p, i, n)

    def _record(self, rec: dict[str, Any]) -> None:
        with self._lock:
            rec["seq"] = self._seq
            self._seq += 1
            assert self._results is not None
            self._results.write(json.dumps(rec, separators=(",", ":")) + "\n")
            self._results.flush()
            if "error" in rec:
                self._failed += 1
            if self._bar is not None:
                self._bar.update(1)
                self._bar.set_postfix(failed=self._failed, refresh=False)

    def _worker(self, worker: int, gpu: int, socket: str | None, sched: _Schedule) -> None:
        while (item := sched.next()) is not None:
            p, i, entry = item
            rec = self._run_one(worker, gpu, socket, p, i, entry)
            self._record(rec)

    # --- the replay ----------------------------------------------------------------------
    def _meta(self, **more: Any) -> dict[str, Any]:
        o = self.opts
        meta: dict[str, Any] = {
            "mode": o.mode.name,
            "concurrency": o.mode.concurrency,
            "enforce": o.mode.enforce,
            "trace": str(o.trace_path),
            "commands_in_trace": len(o.trace),
            "gpus": list(o.gpus),
            "fake_gpus": o.fake_gpus,
            "duration_s": o.duration_s,
            "repeat": o.repeat,
            "python": o.python,
            "cwd": str(o.cwd),
            "host": platform.node(),
            "timeout_s": o.timeout_s,
        }
        meta.update(more)
        return meta

    def _write_meta(self, meta: Mapping[str, Any]) -> None:
        path = self.opts.out / META
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
        tmp.replace(path)

    def run(self) -> Path:
        """Run the replay; returns the path of results.jsonl.

        Raises:
            modes.ModeError: krexd could not be started or reached.
            KeyboardInterrupt: after stopping commands and krexd, meta marked interrupted.
        """
        o = self.opts
        o.out.mkdir(parents=True, exist_ok=True)
        results_path = o.out / RESULTS
        if results_path.exists() and results_path.stat().st_size > 0:
            raise modes.ModeError(f"{results_path} exists; choose an empty --out directory")
        krexd: modes.Krexd | None = None
        socket = o.socket
        if o.mode.uses_krexd and socket is None:
            cfg = modes.write_config(o.mode, o.out / "krexd.toml", o.base_config)
            env = modes.command_env(os.environ, modes.package_pythonpath())
            krexd = modes.Krexd(o.out, cfg, o.fake_gpus, env)
            socket = krexd.socket
        elif socket is not None:
            modes.ping(socket, 2.0)
        per_gpu = o.mode.concurrency if o.mode.uses_krexd else 1
        workers = [(w, o.gpus[w % len(o.gpus)]) for w in range(per_gpu * len(o.gpus))]
        deadline = time.monotonic() + o.duration_s if o.duration_s is not None else None
        if o.repeat is not None:
            repeat = o.repeat
        else:
            repeat = 1 if o.duration_s is None else 1 << 30
        sched = _Schedule(o.trace, repeat, deadline)
        total = None if o.duration_s is not None else len(o.trace) * repeat
        started = time.time()
        self._write_meta(
            self._meta(started=started, ended=None, workers=len(workers), socket=socket)
        )
        interrupted = False
        krexd_died: str | None = None
        self._results = open(results_path, "w", encoding="utf-8")
        self._bar = tqdm(
            total=total,
            unit="cmd",
            desc=f"replay {o.mode.name}",
            disable=not o.progress,
            file=sys.stderr,
        )
        threads = [
            threading.Thread(
                target=self._worker,
                args=(w, g, socket, sched),
                name=f"replay-worker-{w}",
                daemon=True,
            )
            for w, g in workers
        ]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
                    if krexd is not None and krexd.proc.poll() is not None and not krexd_died:
                        krexd_died = f"krexd exited with code {krexd.proc.returncode} mid-run"
                        sched.stopped.set()
        except KeyboardInterrupt:
            interrupted = True
            sched.stopped.set()
            with self._lock:
                children = list(self._children)
            for child in children:
                _kill_group(child, signal.SIGTERM)
            for t in threads:
                t.join(30.0)
            raise
        finally:
            self._bar.close()
            self._results.close()
            krexd_rc = krexd.stop() if krexd is not None else None
            self._write_meta(
                self._meta(
                    started=started,
                    ended=time.time(),
                    workers=len(workers),
                    socket=socket,
                    commands_run=self._seq,
                    commands_failed=self._failed,
                    interrupted=interrupted,
                    krexd_exit_code=krexd_rc,
                    krexd_died=krexd_died,
                )
            )
        if krexd_died is not None:
            raise modes.ModeError(
                f"{krexd_died}; log tail:\n{krexd.log_tail() if krexd is not None else ''}"
            )
        return results_path


def _kill_group(proc: subprocess.Popen[str], sig: int) -> None:
    """Signal the process group of a command this runner started (its own session)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass


def load_results(path: Path) -> list[dict[str, Any]]:
    """Records of a results.jsonl (a truncated last line, from a killed replay, is skipped)."""
    out: list[dict[str, Any]] = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            try:
                obj = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                out.append(obj)
    return out


def finite_or_none(x: float) -> float | None:
    """JSON-friendly float: NaN/inf become None."""
    return x if math.isfinite(x) else None
