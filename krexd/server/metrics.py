"""krexd's Prometheus endpoint (``[metrics]``): a collector over krexd's own counters.

Off by default.  :class:`KrexCollector` reads, at scrape time and in the
server's own thread, the counters krexd keeps anyway; it never takes an
asyncio lock nor runs on the event loop, so a region entry neither formats
nor waits for metrics.  Labels are ``gpu`` and small fixed sets, never a
tenant; the metrics: docs/install.md "Prometheus metrics".
"""

from __future__ import annotations

import logging
import math
import socket
import socketserver
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, make_wsgi_app
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from krexd.config.config import MetricsConfig
from krexd.coordinator.region_stats import ENDED_CAUSES, Histogram, RegionStats
from krexd.orchestration.gpu import Gpu
from krexd.server.status_report import Reported
from krexd.tenancy import states

_log = logging.getLogger("krexd.metrics")
T = TypeVar("T")

TENANT_STATES = (
    states.ADMITTED,
    states.RUNNING,
    states.FREEZING,
    states.FROZEN,
    states.THAWING,
    states.HOLDING,
)
"""The ``state`` label of ``krex_tenants`` (exited tenants are not counted)."""


def _snapshot(read: Callable[[], Iterable[T]]) -> list[T]:
    """``list(read())``, read again when the loop changed the container meanwhile."""
    for _ in range(5):
        try:
            return list(read())
        except RuntimeError:  # "changed size during iteration"
            continue
    return []


def _hist_buckets(h: Histogram, scale: float) -> tuple[list[tuple[str, float]], float]:
    """``h``'s cumulative buckets with bounds times ``scale``, and its sum times ``scale``."""
    pairs = h.cumulative()
    buckets = [("+Inf" if math.isinf(b) else repr(b * scale), float(n)) for b, n in pairs]
    return buckets, h.sum * scale


class _Gpus:
    """The per-GPU families of one scrape."""

    def __init__(self) -> None:
        g = ["gpu"]
        self.slots_used = GaugeMetricFamily(
            "krex_gpu_slots_used", "Admission slots in use", labels=g
        )
        self.slots = GaugeMetricFamily(
            "krex_gpu_slots", "Admission slots of the GPU (commands at once)", labels=g
        )
        self.parked = GaugeMetricFamily(
            "krex_parked_commands",
            'Admission requests parked for this GPU (gpu="any": for any GPU)',
            labels=g,
        )
        self.tenants = GaugeMetricFamily(
            "krex_tenants", "Tenants (commands) on the GPU by state", labels=["gpu", "state"]
        )
        self.held = GaugeMetricFamily(
            "krex_region_held", "1 while a region is held or entered", labels=g
        )
        self.queue = GaugeMetricFamily(
            "krex_region_queue_length", "Region entries waiting for the region lock", labels=g
        )
        self.mem_admitted = GaugeMetricFamily(
            "krex_memory_admitted_bytes",
            "Memory needs admission charged to the GPU's tenants",
            labels=g,
        )
        self.mem_learned = GaugeMetricFamily(
            "krex_memory_learned_bytes", "Learned memory needs of the GPU's tenants (sum)", labels=g
        )
        self.mem_used = GaugeMetricFamily(
            "krex_memory_used_bytes", "GPU memory in use (krexd's last read)", labels=g
        )
        self.mem_total = GaugeMetricFamily("krex_memory_total_bytes", "GPU memory", labels=g)
        self.mps_open = GaugeMetricFamily(
            "krex_mps_incidents_open", "GPU-wide MPS fault incidents not yet recovered", labels=g
        )

    def all(self) -> list[Metric]:
        """Every family, in a stable order."""
        return list(vars(self).values())


class _Regions:
    """The per-GPU region families of one scrape (from ``RegionStats``)."""

    def __init__(self) -> None:
        g = ["gpu"]

        def counter(name: str, doc: str, labels: list[str] = g) -> CounterMetricFamily:
            return CounterMetricFamily(name, doc, labels=labels)

        self.entered = counter("krex_regions_entered", "Critical regions granted")
        self.completed = counter("krex_regions_completed", "Regions ended by their holder's exit")
        self.recovered = counter("krex_regions_recovered", "Regions ended by recovery")
        self.contaminated = counter(
            "krex_regions_contaminated", "Regions the witness saw another process run in"
        )
        self.adopted = counter("krex_regions_adopted", "Regions adopted after a krexd restart")
        self.refused = counter(
            "krex_region_entries_refused", "Region entries that failed, by error code",
            ["gpu", "code"],
        )  # fmt: skip
        self.drain_timeouts = counter(
            "krex_region_drain_timeouts", "Entries in which a sibling did not drain in time"
        )
        self.freeze_timeouts = counter(
            "krex_region_freeze_timeouts", "Entries failed for a freeze not done in time"
        )
        self.ended = counter(
            "krex_commands_ended", "Commands krex ended, by reason", ["gpu", "reason"]
        )
        self.entry = HistogramMetricFamily(
            "krex_region_entry_seconds", "Region entry latency (request to grant)", labels=g
        )
        self.steps = HistogramMetricFamily(
            "krex_region_entry_step_seconds",
            "Region entry latency by step (drain, freeze, check, ...)",
            labels=["gpu", "step"],
        )
        self.hold = HistogramMetricFamily(
            "krex_region_hold_seconds", "How long regions were held (grant to end)", labels=g
        )

    def add(self, gpu: str, s: RegionStats) -> None:
        """Add GPU ``gpu``'s counters and histograms."""
        for family, value in (
            (self.entered, s.granted),
            (self.completed, s.completed),
            (self.recovered, s.recovered),
            (self.contaminated, s.contaminated),
            (self.adopted, s.adopted),
            (self.drain_timeouts, s.drain_timeouts),
            (self.freeze_timeouts, s.freeze_timeouts),
        ):
            family.add_metric([gpu], value)
        for code, n in _snapshot(lambda: dict(s.refused).items()):
            self.refused.add_metric([gpu, code], n)
        ended = dict(s.ended)
        for reason in ENDED_CAUSES:
            self.ended.add_metric([gpu, reason], ended.get(reason, 0))
        buckets, total = _hist_buckets(s.entry_hist, 1e-3)
        self.entry.add_metric([gpu], buckets, total)
        for step, h in s.step_hist.items():
            buckets, total = _hist_buckets(h, 1e-3)
            self.steps.add_metric([gpu, step], buckets, total)
        buckets, total = _hist_buckets(s.hold_hist, 1.0)
        self.hold.add_metric([gpu], buckets, total)

    def all(self) -> list[Metric]:
        """Every family, in a stable order."""
        return list(vars(self).values())


class KrexCollector(Collector):
    """Reads ``daemon``'s counters at each scrape (see the module docstring).

    ``scrapes``: how many times :meth:`collect` ran (exported as
    ``krex_metrics_scrapes_total``; tests check it grows with scrapes only).
    """

    def __init__(self, daemon: Reported) -> None:
        self._d = daemon
        self.scrapes = 0

    def collect(self) -> Iterator[Metric]:
        """Every krex metric, read now (called by the registry in the HTTP thread)."""
        self.scrapes += 1
        gpus, regions = _Gpus(), _Regions()
        parked = self._parked()
        tenants = _snapshot(lambda: self._d.tenants)
        for gpu in _snapshot(lambda: self._d.gpus.values()):
            self._gpu(gpus, gpu, tenants, parked)
            regions.add(str(gpu.index), gpu.coordinator.stats)
        if parked.get("any"):
            gpus.parked.add_metric(["any"], parked["any"])
        yield from gpus.all()
        yield from regions.all()
        yield from self._daemon()

    def _parked(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for w in _snapshot(lambda: self._d.admission.parked):
            key = "any" if w.gpu is None else str(w.gpu)
            out[key] = out.get(key, 0) + 1
        return out

    def _gpu(self, f: _Gpus, gpu: Gpu, tenants: list[Any], parked: dict[str, int]) -> None:
        """One GPU's gauges into ``f``."""
        label = [str(gpu.index)]
        f.slots_used.add_metric(label, gpu.slots.used)
        f.slots.add_metric(label, gpu.slots.total)
        f.parked.add_metric(label, parked.get(label[0], 0))
        mine = [t for t in tenants if t.gpu == gpu.index]
        for state in TENANT_STATES:
            count = sum(1 for t in mine if t.state == state)
            f.tenants.add_metric([label[0], state.value], count)
        f.held.add_metric(label, 0 if gpu.coordinator.idle() else 1)
        f.queue.add_metric(label, gpu.coordinator.waiting())
        f.mem_admitted.add_metric(label, sum(t.memory.need_bytes for t in mine))
        f.mem_learned.add_metric(label, sum(t.memory.learned_bytes or 0 for t in mine))
        view = gpu.memory.view
        if view is not None:
            f.mem_used.add_metric(label, view.used)
            f.mem_total.add_metric(label, view.total)
        faults = self._d.faults
        f.mps_open.add_metric(
            label, 1 if faults is not None and gpu.index in faults.incidents else 0
        )

    def _daemon(self) -> Iterator[Metric]:
        """krexd's own counters: restarts, adoptions, requests, connections, MPS, warm pools."""
        d = self._d
        c = d.counters
        yield _gauge("krex_daemon_start_time_seconds", "krexd's start (Unix time)", c.started_at)
        yield _counter("krex_daemon_restarts", "Restarts continued from", c.restarts)
        yield _counter(
            "krex_daemon_adopted_tenants", "Tenants adopted at this start", c.adopted_tenants
        )
        yield _counter("krex_metrics_scrapes", "Scrapes of this endpoint", self.scrapes)
        server = d.server
        if server is not None:
            yield _counter("krex_requests", "Control requests received", server.requests)
            refused = CounterMetricFamily(
                "krex_requests_refused", "Requests answered with an error, by code", labels=["code"]
            )
            for code, n in _snapshot(lambda: dict(server.refused).items()):
                refused.add_metric([code], n)
            yield refused
            if server.guard is not None:
                conn = server.guard.status()
                yield _gauge("krex_connections_open", "Open control connections", conn["open"])
                yield _gauge("krex_connections_peak", "Most connections open at once", conn["peak"])
                yield _counter(
                    "krex_connections_refused", "Connections closed at the cap", conn["refused"]
                )
        yield from _mps(d)
        yield from _warm(d)
        yield _learned_labels(d)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(name, doc, value=value)


def _mps(d: Reported) -> Iterator[Metric]:
    """MPS fault incidents (``[mps] enabled``; docs/design/faults.md)."""
    if d.faults is None:
        return
    totals = dict(d.faults.totals)
    yield _counter("krex_mps_incidents", "GPU-wide MPS fault incidents", totals.get("incidents", 0))
    members = CounterMetricFamily(
        "krex_mps_incident_commands", "Commands in MPS incidents, by role", labels=["role"]
    )
    for role, key in (("culprit", "culprits"), ("casualty", "casualties"), ("suspect", "suspects")):
        members.add_metric([role], totals.get(key, 0))
    yield members


def _warm(d: Reported) -> Iterator[Metric]:
    """Warm pools (``[warm]``): pools, warm starts (hits), cold starts, refused pools."""
    pools = d.pools
    if pools is None:
        return
    yield _gauge("krex_warm_pools", "Warm pools registered", len(pools))
    yield _counter("krex_warm_starts", "Commands started from a warm pool", pools.warm_starts)
    yield _counter("krex_cold_starts", "Commands started cold, warm pools on", pools.cold_starts)
    by_reason = CounterMetricFamily(
        "krex_cold_starts_by_reason",
        "Commands started cold, warm pools on, by the reason krex run gave",
        labels=["reason"],
    )
    seen = _snapshot(lambda: dict(pools.cold_reasons).items())
    for reason, n in seen:
        by_reason.add_metric([reason], n)
    yield by_reason
    yield _counter("krex_warm_pools_refused", "Warm pool registrations refused", pools.refused)


def _learned_labels(d: Reported) -> Metric:
    count = d.memory.learned_labels() if d.memory is not None else 0
    return _gauge("krex_memory_learned_labels", "Labels whose memory needs are learned", count)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """One thread per scrape (a slow scraper does not hold up another)."""

    daemon_threads = True


class _Server6(_Server):
    address_family = socket.AF_INET6


class _Quiet(WSGIRequestHandler):
    """No access log line per scrape on stderr."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the base's name
        return


class MetricsServer:
    """The endpoint of ``[metrics]``: its registry, collector and HTTP server thread.

    ``port`` is the bound port (the configured one, or the kernel's pick for 0).
    """

    def __init__(self, cfg: MetricsConfig, daemon: Reported) -> None:
        self.cfg = cfg
        self.collector = KrexCollector(daemon)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        self.port = cfg.port
        self._httpd: Any = None
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        """Bind and serve in a daemon thread.  Raises ``OSError`` when the port is taken."""
        cfg = self.cfg
        server = _Server6 if ":" in cfg.address else _Server
        app = make_wsgi_app(self.registry)
        self._httpd = make_server(cfg.address, cfg.port, app, server, handler_class=_Quiet)
        self.port = int(self._httpd.server_address[1])
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="krexd-metrics", daemon=True
        )
        self._thread.start()
        _log.info("metrics: http://%s:%d/metrics", cfg.address, self.port)

    def stop(self) -> None:
        """Stop serving and close the socket (idempotent)."""
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
            self._httpd = None

    def status(self) -> dict[str, Any]:
        """``{"address", "port", "scrapes"}`` for ``status``."""
        return {"address": self.cfg.address, "port": self.port, "scrapes": self.collector.scrapes}
