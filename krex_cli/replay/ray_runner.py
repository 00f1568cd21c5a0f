"""``krex replay --ray ADDRESS``: the trace's commands spread over a Ray cluster of krex hosts.

The runner of ``runner.py`` with Ray in place of a local krexd: each
command is a ``krex_client.cluster`` task running ``krex run`` against the
krexd of the host Ray chose, one in flight per ``krex_slot``.
docs/design/replay.md "Over a Ray cluster (``--ray ADDRESS``)"; the record's
extra fields: "results.jsonl".
"""

from __future__ import annotations

import json
import threading
import time
from typing import Any

from krex_cli.replay import modes, starts
from krex_cli.replay.options import RunOptions, resolve_argv
from krex_cli.replay.results import record_outcome
from krex_cli.replay.runner import Runner, _Schedule
from krex_cli.replay.trace import TraceEntry
from krex_client import cluster

MAX_RETRIES = 2
"""Runs of a command after a lost worker or host (Ray's task retries)."""
RESULT_SLACK_S = 300.0
"""Beyond ``--timeout``, how long a result may take (queueing, retries) before it is given up."""
_START: dict[bool | None, str | None] = {None: None, True: "warm", False: "cold"}
"""A command's ``cluster.Command.start`` by ``starts.asks_warm``'s answer."""


class RayRunner(Runner):
    """Runs one replay over the Ray cluster at ``opts.ray_address``; ``run()`` as Runner's."""

    def __init__(self, opts: RunOptions) -> None:
        super().__init__(opts)
        self._capacity: dict[str, float] = {}
        self._in_flight: set[Any] = set()

    def _start_krexd(self) -> tuple[modes.Krexd | None, str | None]:
        """Connect to the cluster (no krexd here); ModeError without Ray or a krex host."""
        try:
            import ray
        except ImportError:
            raise modes.ModeError("--ray needs Ray: pip install 'krex[ray]'") from None

        ray.init(address=self.opts.ray_address, logging_level="WARNING", log_to_driver=False)
        self._capacity = cluster.capacity()
        if not self._capacity:
            ray.shutdown()
            raise modes.ModeError(
                f"the Ray cluster at {self.opts.ray_address} has no krex host (no node offers "
                f"{cluster.SLOT}: start each host's Ray node with `krex ray-resources --exec`)"
            )
        return None, None

    def _plan(self) -> tuple[list[tuple[int, int]], _Schedule, int | None]:
        """One worker per ``krex_slot`` of the cluster (GPU -1: the host's krexd chooses)."""
        _, sched, total = super()._plan()
        slots = int(sum(self._capacity.values()))
        return [(w, -1) for w in range(slots)], sched, total

    def _meta(self, **more: Any) -> dict[str, Any]:
        meta = super()._meta(**more)
        # Concurrency is the cluster's, not --concurrency's: one command per krex_slot.
        slots = int(sum(self._capacity.values()))
        meta.update(ray=self.opts.ray_address, hosts=self._capacity, gpus=[], concurrency=slots)
        return meta

    def _attempt(
        self, worker: int, gpu: int, socket: str | None, p: int, i: int, entry: TraceEntry
    ) -> dict[str, Any]:
        """Run one command once on the cluster and record its outcome."""
        o = self.opts
        rec = self._new_record(worker, gpu, p, i, entry, {})
        rec["gpu"] = None  # the host's krexd chooses: known from the result
        rec["concurrency"] = int(sum(self._capacity.values()))  # the cluster's krex_slot
        mem = entry.extra.get("mem")
        command = cluster.Command(
            resolve_argv(entry.argv, o.python),
            cwd=str(o.cwd),
            mem=mem if isinstance(mem, str) and mem else None,
            timeout_s=o.timeout_s,
            start=_START[starts.asks_warm(o.warm, p, i)],
        )
        rec["start"] = time.time()
        t0 = time.monotonic()
        res, error = self._run_remote(command, o.timeout_s + RESULT_SLACK_S)
        rec["end"] = time.time()
        rec["wall_s"] = time.monotonic() - t0
        if res is None:
            rec.update(exit_code=None, result=None, stderr_tail="", error=error)
            return rec
        rec.update(
            exit_code=res.exit_code,
            gpu=res.gpu,
            host=res.host,
            node=res.node_id,
            attempt=res.attempt,
            queued_s=res.timings.queued_s,
            admit_wait_s=res.timings.admit_wait_s,
            ran_s=res.timings.ran_s,
        )
        self._write_regions(rec["region_log"], res.regions)
        record_outcome(rec, res.stdout, res.stderr, res.exit_code, None)
        return rec

    def _run_remote(
        self, command: cluster.Command, limit_s: float
    ) -> tuple[cluster.Result | None, str]:
        """(the command's result, "") or (None, why there is none)."""
        import ray

        ref = cluster.submit(command, max_retries=MAX_RETRIES)
        with self._lock:
            self._in_flight.add(ref)
        try:
            return ray.get(ref, timeout=limit_s), ""
        except ray.exceptions.GetTimeoutError:
            ray.cancel(ref, force=True)
            return None, f"no result within {limit_s:g} s"
        except ray.exceptions.RayError as exc:
            return (
                None,
                f"ray: {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
            )
        finally:
            with self._lock:
                self._in_flight.discard(ref)

    def _write_regions(self, log: str, records: list[dict[str, Any]]) -> None:
        """The command's region records, as its own log in the run directory."""
        with open(self.opts.out / log, "w", encoding="utf-8") as f:
            f.writelines(json.dumps(r, separators=(",", ":")) + "\n" for r in records)

    def _stop(self, threads: list[threading.Thread], sched: _Schedule) -> None:
        """On interrupt: no new commands; cancel those in flight (their tenants end)."""
        import ray

        sched.stopped.set()
        with self._lock:
            refs = list(self._in_flight)
        for ref in refs:
            ray.cancel(ref)
        for t in threads:
            t.join(30.0)

    def _finish(
        self, krexd: Any, started: float, workers: int, socket: Any, interrupted: bool
    ) -> None:
        """Runner's end, then the driver leaves the cluster."""
        import ray

        try:
            super()._finish(krexd, started, workers, socket, interrupted)
        finally:
            ray.shutdown()
