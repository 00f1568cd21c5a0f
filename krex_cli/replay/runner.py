"""Run a trace in one mode and record every command (``results.jsonl``, ``meta.json``).

Workers pull commands in trace order from one shared queue, so a task's
candidates stay interleaved with other tasks as in the agents'
trajectories.  The modes: docs/design/replay.md "Modes (paper §6.1)"; each
command's record: "results.jsonl" (completed in ``results.py``; options and
each command's argv and environment in ``options.py``).
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import IO, Any

from tqdm import tqdm  # type: ignore[import-untyped, unused-ignore]

from krex_cli.replay import daemon_info, modes, regions, starts
from krex_cli.replay.options import RunOptions, command
from krex_cli.replay.results import RESULTS, record_outcome, write_meta
from krex_cli.replay.trace import TraceEntry

EX_TEMPFAIL = 75
"""``krex run``'s exit code when co-tenants' GPU memory failed the command."""
TEMPFAIL_RETRIES = 2


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
        if not opts.gpus and opts.ray_address is None:
            raise modes.ModeError("no GPU to run on")
        self.opts = opts
        self._lock = threading.Lock()
        self._seq = 0
        self._children: set[subprocess.Popen[str]] = set()
        self._results: IO[str] | None = None
        self._bar: Any = None
        self._failed = 0
        self._logs: dict[tuple[int, int], int] = {}  # region logs per (pass, index)
        self._krexd_died: str | None = None

    # --- one command ---------------------------------------------------------------------
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
        """Run one command once: start it, wait for it, record its outcome."""
        # --warm off and alternate's cold half pass --cold: krexd's own default ([warm]
        # start, "warm" as shipped) must not decide for them; auto passes no flag.
        krexd = self.opts.mode.uses_krexd
        asked = starts.asks_warm(self.opts.warm, p, i)
        flags = starts.run_flags(asked) if krexd else []
        argv, env = command(self.opts, entry, gpu, socket, flags)
        rec = self._new_record(worker, gpu, p, i, entry, env)
        rec["start"] = time.time()
        t0 = time.monotonic()
        try:
            proc = self._spawn(argv, env)
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
        out, err, error = self._wait(proc)
        rec["end"] = time.time()
        rec["wall_s"] = time.monotonic() - t0
        rec["exit_code"] = proc.returncode
        record_outcome(rec, out, err, proc.returncode, error)
        if krexd and self.opts.warm != "off":
            rec["warm"] = starts.outcome(asked, err)
        return rec

    def _new_record(
        self, worker: int, gpu: int, p: int, i: int, entry: TraceEntry, env: dict[str, str]
    ) -> dict[str, Any]:
        """The record's fields known before the start; under krexd, a fresh region log in env."""
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
        return rec

    def _spawn(self, argv: list[str], env: dict[str, str]) -> subprocess.Popen[str]:
        """Start a command in its own session (raises OSError when it cannot start)."""
        return subprocess.Popen(
            argv,
            cwd=self.opts.cwd,
            env=env,
            text=True,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
        )

    def _wait(self, proc: subprocess.Popen[str]) -> tuple[str, str, str | None]:
        """(stdout, stderr, error): wait for a command, killing its group at the timeout."""
        error: str | None = None
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
        return out, err, error

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
            "warm": o.warm,
        }
        meta.update(more)
        return meta

    def _write_meta(self, meta: Mapping[str, Any]) -> None:
        write_meta(self.opts.out, meta)

    def run(self) -> Path:
        """Run the replay; returns the path of results.jsonl.

        Raises:
            modes.ModeError: krexd could not be started or reached.
            KeyboardInterrupt: after stopping commands and krexd, meta marked interrupted.
        """
        results_path = self._results_path()
        krexd, socket = self._start_krexd()
        if self.opts.slots_from_krexd and socket is not None:
            self._take_started_slots(krexd, socket)
        workers, sched, total = self._plan()
        started = time.time()
        self._write_meta(
            self._meta(started=started, ended=None, workers=len(workers), socket=socket)
        )
        interrupted = False
        self._krexd_died = None
        self._open_outputs(results_path, total)
        threads = self._threads(workers, socket, sched)
        try:
            self._join_watching(threads, krexd, sched)
        except KeyboardInterrupt:
            interrupted = True
            self._stop(threads, sched)
            raise
        finally:
            self._finish(krexd, started, len(workers), socket, interrupted)
        if self._krexd_died is not None:
            raise modes.ModeError(
                f"{self._krexd_died}; log tail:\n{krexd.log_tail() if krexd is not None else ''}"
            )
        return results_path

    def _results_path(self) -> Path:
        """results.jsonl in the (created) output directory; ModeError when it holds records."""
        o = self.opts
        o.out.mkdir(parents=True, exist_ok=True)
        results_path = o.out / RESULTS
        if results_path.exists() and results_path.stat().st_size > 0:
            raise modes.ModeError(f"{results_path} exists; choose an empty --out directory")
        return results_path

    def _start_krexd(self) -> tuple[modes.Krexd | None, str | None]:
        """(krexd started here or None, socket): start one, or check the given socket."""
        o = self.opts
        krexd: modes.Krexd | None = None
        socket = o.socket
        if o.mode.uses_krexd and socket is None:
            cfg = modes.write_config(
                o.mode, o.out / "krexd.toml", o.base_config, auto_slots=o.slots_from_krexd
            )
            env = modes.command_env(os.environ, modes.package_pythonpath())
            krexd = modes.Krexd(o.out, cfg, o.fake_gpus, env)
            socket = krexd.socket
        elif socket is not None:
            modes.ping(socket, 2.0)
        return krexd, socket

    def _take_started_slots(self, krexd: modes.Krexd | None, socket: str) -> None:
        """The mode's concurrency becomes the started krexd's derived slots (said on stderr)."""
        try:
            slots, note = daemon_info.started_slots(socket, self.opts.gpus)
        except modes.ModeError:
            if krexd is not None:
                krexd.stop()
            raise
        print(f"krex replay: {note}", file=sys.stderr)
        self.opts = dataclasses.replace(
            self.opts, mode=dataclasses.replace(self.opts.mode, concurrency=slots)
        )

    def _plan(self) -> tuple[list[tuple[int, int]], _Schedule, int | None]:
        """(workers as (worker, gpu), the schedule, commands expected or None when looping)."""
        o = self.opts
        per_gpu = o.mode.concurrency if o.mode.uses_krexd else 1
        workers = [(w, o.gpus[w % len(o.gpus)]) for w in range(per_gpu * len(o.gpus))]
        deadline = time.monotonic() + o.duration_s if o.duration_s is not None else None
        if o.repeat is not None:
            repeat = o.repeat
        else:
            repeat = 1 if o.duration_s is None else 1 << 30
        sched = _Schedule(o.trace, repeat, deadline)
        total = None if o.duration_s is not None else len(o.trace) * repeat
        return workers, sched, total

    def _open_outputs(self, results_path: Path, total: int | None) -> None:
        """Open results.jsonl for writing and the progress bar."""
        self._results = open(results_path, "w", encoding="utf-8")
        self._bar = tqdm(
            total=total,
            unit="cmd",
            desc=f"replay {self.opts.mode.name}",
            disable=not self.opts.progress,
            file=sys.stderr,
        )

    def _threads(
        self, workers: list[tuple[int, int]], socket: str | None, sched: _Schedule
    ) -> list[threading.Thread]:
        """One (not yet started) thread per worker."""
        return [
            threading.Thread(
                target=self._worker,
                args=(w, g, socket, sched),
                name=f"replay-worker-{w}",
                daemon=True,
            )
            for w, g in workers
        ]

    def _join_watching(
        self, threads: list[threading.Thread], krexd: modes.Krexd | None, sched: _Schedule
    ) -> None:
        """Start the workers and wait for them; stop the schedule if our krexd exits."""
        for t in threads:
            t.start()
        for t in threads:
            while t.is_alive():
                t.join(0.2)
                if krexd is not None and krexd.proc.poll() is not None and not self._krexd_died:
                    self._krexd_died = f"krexd exited with code {krexd.proc.returncode} mid-run"
                    sched.stopped.set()

    def _stop(self, threads: list[threading.Thread], sched: _Schedule) -> None:
        """On interrupt: no new commands, SIGTERM to running ones, wait for the workers."""
        sched.stopped.set()
        with self._lock:
            children = list(self._children)
        for child in children:
            _kill_group(child, signal.SIGTERM)
        for t in threads:
            t.join(30.0)

    def _finish(
        self,
        krexd: modes.Krexd | None,
        started: float,
        workers: int,
        socket: str | None,
        interrupted: bool,
    ) -> None:
        """Close the bar and results.jsonl, stop our krexd, write the final meta.json."""
        assert self._results is not None
        self._bar.close()
        self._results.close()
        krexd_rc = krexd.stop() if krexd is not None else None
        self._write_meta(
            self._meta(
                started=started,
                ended=time.time(),
                workers=workers,
                socket=socket,
                commands_run=self._seq,
                commands_failed=self._failed,
                interrupted=interrupted,
                krexd_exit_code=krexd_rc,
                krexd_died=self._krexd_died,
            )
        )


def _kill_group(proc: subprocess.Popen[str], sig: int) -> None:
    """Signal the process group of a command this runner started (its own session)."""
    try:
        os.killpg(proc.pid, sig)
    except ProcessLookupError:
        pass
