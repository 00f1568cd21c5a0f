"""krex under Ray: commands placed by Ray, enforced by each host's krexd.

A local Ray cluster with two krex hosts (tests/cluster/conftest.py), each
with its own krexd.  Observed: commands spread over both hosts and never run
more at once on a host than its krexd's slots (the commands record their own
start and end; krexd never had to park one); results carry host, GPU and
region records; ``ray.cancel`` ends the krex tenant (the command's process is
gone and krexd lists no tenant); a command whose host goes away is run again
elsewhere and says so.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from krex_client import cluster
from tests.cluster.conftest import KrexCluster
from tests.support import gone, wait_for

ray = pytest.importorskip("ray")

# serial: one Ray cluster per module, in order; a second one in another test process
# would meet it on the head node's fixed ports.
pytestmark = [pytest.mark.root, pytest.mark.slow, pytest.mark.serial]
REPO = Path(__file__).resolve().parents[2]
SIMULATED = REPO / "workloads" / "simulated.py"


def test_each_ray_node_advertises_its_own_krexds_capacity(krex_cluster: KrexCluster) -> None:
    for name, host in krex_cluster.hosts.items():
        status = host.krexd.status()
        slots = sum(g["slots_total"] for g in status["gpus"])
        assert slots == host.slots == 2
        p = subprocess.run(
            [sys.executable, "-m", "krex_cli", "ray-resources", "--socket", host.krexd.socket]
            + ["--host", name],
            capture_output=True,
            text=True,
            timeout=30,
        )
        assert p.returncode == 0, p.stderr
        assert json.loads(p.stdout) == {"krex_slot": 2, "krex_gpu": 2, f"krex_host_{name}": 2}
        # Exactly one live Ray node names the host, with that krexd's slots and GPUs.
        (res,) = [
            n["Resources"]
            for n in ray.nodes()
            if n["Alive"] and f"krex_host_{name}" in n["Resources"]
        ]
        assert (res["krex_slot"], res["krex_gpu"]) == (2.0, 2.0)
    assert cluster.capacity() == {"a": 2.0, "b": 2.0}


SPAN = (
    "import os, sys, time; t0 = time.time(); time.sleep(float(sys.argv[1])); "
    "print(os.environ['KREX_HOST'], os.environ['KREX_GPU'], t0, time.time())"
)


def max_overlap(spans: list[tuple[float, float]]) -> int:
    """The most spans running at one instant."""
    events = sorted([(s, 1) for s, _ in spans] + [(e, -1) for _, e in spans])
    running = most = 0
    for _, step in events:
        running += step
        most = max(most, running)
    return most


def test_commands_spread_over_hosts_and_never_exceed_a_hosts_slots(
    krex_cluster: KrexCluster,
) -> None:
    before = {n: h.krexd.status()["queue"]["parked_total"] for n, h in krex_cluster.hosts.items()}
    node_ids = {n: h.node.node_id for n, h in krex_cluster.hosts.items()}
    refs = [
        cluster.submit(cluster.Command([sys.executable, "-c", SPAN, "0.6"], region_log=False))
        for _ in range(10)
    ]
    results: list[cluster.Result] = ray.get(refs, timeout=120)
    spans: dict[str, list[tuple[float, float]]] = {}
    for res in results:
        assert res.ok, res.stderr
        host, gpu, t0, t1 = res.stdout.split()
        # The command ran on the host the result names, on the GPU krexd granted.
        assert host == res.host and int(gpu) == res.gpu and res.gpu in (0, 1)
        assert res.attempt == 1 and res.admissions == 1 and res.tenant is not None
        assert res.node_id in node_ids[res.host]
        assert res.timings.queued_s >= 0 and res.timings.ran_s is not None
        spans.setdefault(res.host, []).append((float(t0), float(t1)))
    assert set(spans) == {"a", "b"}, spans
    for name, host_spans in spans.items():
        assert max_overlap(host_spans) <= krex_cluster.hosts[name].slots, (name, host_spans)
    # Ray never sent a host more than its krexd admits at once: krexd parked none.
    for name, host in krex_cluster.hosts.items():
        assert host.krexd.status()["queue"]["parked_total"] == before[name]


def test_results_carry_region_records_and_bounded_output(krex_cluster: KrexCluster) -> None:
    argv = ["python", str(SIMULATED), "--task", "t", "--candidate", "c", "--kernel-us", "200"]
    argv[0] = sys.executable
    res = cluster.run(cluster.Command(argv, cwd=str(REPO), label="sim-c", mem="1G"))
    assert res.ok, res.stderr
    assert len(res.regions) == 1 and res.regions[0]["region_ms"] > 0.0
    assert res.regions[0]["gpu"] == res.gpu and res.regions[0]["tenant"] == res.tenant
    assert json.loads(res.stdout.splitlines()[-1])["median_ms"] > 0.0
    big = "import sys; sys.stdout.write('x' * 300000 + 'END'); sys.stderr.write('e' * 10)"
    res = cluster.run(cluster.Command([sys.executable, "-c", big]))
    assert res.stdout_bytes == 300003 and len(res.stdout) == cluster.OUTPUT_TAIL
    assert res.stdout.endswith("xEND") and res.stderr == "e" * 10


def started_marker(path: Path) -> Callable[[], bool]:
    return lambda: path.is_file() and path.read_text().strip() != ""


def tenants_of(host: Any) -> list[dict[str, Any]]:
    return list(host.krexd.status()["tenants"])


@pytest.mark.parametrize("how", ["graceful", "ignores-sigterm", "force"])
def test_cancel_ends_the_krex_tenant(krex_cluster: KrexCluster, tmp_path: Path, how: str) -> None:
    pidfile = tmp_path / "pid"
    trap = "trap '' TERM; " if how == "ignores-sigterm" else ""
    script = f"{trap}echo $$ > {pidfile}; while :; do sleep 0.1; done"
    ref = cluster.submit(cluster.Command(["sh", "-c", script]), cancel_grace_s=1.0)
    wait_for(started_marker(pidfile), what="command started")
    pid = int(pidfile.read_text())
    running = [h for h in krex_cluster.hosts.values() if tenants_of(h)]
    assert len(running) == 1 and not gone(pid)
    ray.cancel(ref, force=how == "force")
    with pytest.raises((ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError)):
        ray.get(ref, timeout=30)
    wait_for(lambda: gone(pid), 15.0, "the command's end")
    wait_for(lambda: tenants_of(running[0]) == [], 15.0, "krexd's release of the tenant")


def replay(*args: str) -> subprocess.CompletedProcess[str]:
    """``krex replay ARGS`` (simulated kernels are sleeps, as on the hosts)."""
    env = dict(os.environ, SIMULATED_SLEEP="1")
    return subprocess.run(
        [sys.executable, "-m", "krex_cli", "replay", *args, "--no-progress"],
        capture_output=True,
        text=True,
        timeout=240,
        env=env,
        cwd=REPO,
    )


def test_replay_over_ray_reports_hosts_and_fidelity(
    krex_cluster: KrexCluster, tmp_path: Path
) -> None:
    from krex_cli.replay import trace
    from krex_cli.replay.results import load_results

    entries = [
        trace.TraceEntry(
            ("python", str(SIMULATED), "--task", task, "--candidate", cand, "--kernel-us", us)
            + ("--reps", "10", "--setup-ms", "300"),
            task,
            cand,
            None,
        )
        for task, cand, us in [("t1", "a", "1500"), ("t1", "b", "2500"), ("t2", "x", "4000")]
        for _ in range(2)
    ]
    tr = tmp_path / "trace.jsonl"
    trace.dump(entries, tr)
    runs = tmp_path / "runs"
    p = replay(str(tr), "--mode", "native", "--fake-gpus", "1", "--out", str(runs / "native"))
    assert p.returncode == 0, p.stderr
    p = replay(str(tr), "--mode", "krex", "--ray", krex_cluster.address, "--out", str(runs / "ray"))
    assert p.returncode == 0, p.stderr
    recs = load_results(runs / "ray" / "results.jsonl")
    assert len(recs) == len(entries) and all(r["exit_code"] == 0 for r in recs), recs
    assert {r["host"] for r in recs} == {"a", "b"} and all(r["gpu"] in (0, 1) for r in recs)
    assert all(r["attempt"] == 1 and r["queued_s"] >= 0 for r in recs)
    meta = json.loads((runs / "ray" / "meta.json").read_text())
    assert meta["ray"] == krex_cluster.address and meta["workers"] == 4
    assert meta["hosts"] == {"a": 2.0, "b": 2.0}
    # The report's concurrency is the cluster's slots (it read 1, --concurrency's default).
    assert meta["concurrency"] == 4 and {r["concurrency"] for r in recs} == {4}
    # Per host and whole cluster on the console and in the report; fidelity against native.
    said = [ln for ln in p.stdout.splitlines() if ln.startswith("throughput ")]
    assert [ln.split()[1] for ln in said] == ["a:", "b:", "cluster:"], p.stdout
    data = json.loads((runs / "ray" / "report" / "metrics.json").read_text())
    run = data["runs"]["ray"]
    assert data["reference"] == "native" and run["completed"] == len(entries)
    assert set(run["hosts"]["hosts"]) == {"a", "b"} and run["hosts"]["cluster"]["cmds_per_min"] > 0
    f = run["stats"]["median"]["fidelity"]
    assert f["n"] == len(entries) and 0.8 < f["median_ratio"] < 1.5
    assert run["regions"]["regions"] == len(entries)  # the records came back from the hosts
    assert "## Hosts" in (runs / "ray" / "report" / "report.md").read_text()


def test_a_command_whose_host_goes_away_runs_again_elsewhere(
    krex_cluster: KrexCluster, tmp_path: Path
) -> None:
    c = krex_cluster.add_host("c")
    marks = tmp_path / "marks"
    # The first run records its host and waits; the second (elsewhere) ends at once.
    script = f'echo "$KREX_HOST $$" >> {marks}; [ $(wc -l < {marks}) -gt 1 ] || sleep 60'
    ref = cluster.submit(cluster.Command(["sh", "-c", script], prefer_host="c"), max_retries=2)
    wait_for(started_marker(marks), 60.0, "the first run")
    host, pid = marks.read_text().split()
    assert host == "c" and len(tenants_of(c)) == 1
    krex_cluster.remove_host("c")
    res: cluster.Result = ray.get(ref, timeout=120)
    assert res.ok and res.attempt == 2 and res.host in ("a", "b"), res
    assert [line.split()[0] for line in marks.read_text().splitlines()] == ["c", res.host]
    # The lost host's krexd ended the first run: its launcher died with the Ray worker.
    wait_for(lambda: gone(int(pid)), 15.0, "the first run's end")
    wait_for(lambda: tenants_of(c) == [], 15.0, "host c's krexd releasing the tenant")
    assert os.path.exists(c.krexd.socket)  # krexd itself was not touched
