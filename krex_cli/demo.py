"""``make demo`` / ``python -m krex_cli.demo``: the main job, short.

Replays a few benchmarking commands natively and through krex at
concurrency 4, then prints the report's summary (paper §6): the first
commands of ``workloads/trace-h200.jsonl`` on a host with an NVIDIA GPU,
simulated ones on the fake driver (``--fake-gpus 1``) without.  Needs root
(krexd manages cgroups); run through sudo, the files are given to that user.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from krex_cli.replay.cli import count_gpus
from krex_cli.replay.metrics import MIN_PAIRS

REPO = Path(__file__).resolve().parent.parent
GPU_TRACE = REPO / "workloads" / "trace-h200.jsonl"
GPU_COMMANDS = 10
SIMULATED = "workloads/simulated.py"
# The fake CUDA driver of a source checkout (``make`` builds it there).
FAKE_DRIVER = REPO / "build" / "fakecuda"
# (task, [(candidate, kernel µs)]): three tasks whose candidates differ by 5-20 %.
FAKE_TASKS = [
    ("scale_vec", [("v1", 40.0), ("v2", 44.0), ("v3", 48.0)]),
    ("reduce_rows", [("naive", 600.0), ("tiled", 520.0), ("warp", 500.0)]),
    ("gemm_tile", [("t64", 2400.0), ("t128", 2100.0), ("t256", 2000.0)]),
]


#: What each figure of the summary means, printed under its tables (metrics: krex_cli/replay/
#: metrics.py; "native" is the reference run: one command at a time, no krex).
EXPLAINED: tuple[tuple[str, str], ...] = (
    ("cmds/min", "commands that exited 0, per minute of the run's wall time"),
    ("x reference", "cmds/min against the native run's"),
    ("n", "commands whose kernel time is compared with the native time of the same command"),
    (
        "P",
        "p95 timing inflation: (95th percentile of measured / native kernel time - 1) x 100; "
        "0% means timed as natively",
    ),
    ("P >10ms, P >1ms, P >0.1ms", "P of the commands whose native kernel time exceeds that"),
    ("median ratio", "median of measured / native kernel time (1.0 means the same)"),
    ("within 5%", "share of the commands timed within 5% of their native time"),
    (
        "median tau-b",
        "median over tasks of Kendall's tau-b between the native and the measured ranking "
        "of a task's candidates (1 same order, -1 reversed)",
    ),
    (
        "P by kernel-duration band",
        "P of the commands whose native kernel time is in that band (n: how many)",
    ),
    (
        "flip rate by native gap",
        "share of a task's candidate pairs ranked in the opposite order to native, by how "
        "far apart they were natively (|a - b| / min(a, b)); a gap with fewer than "
        f"{MIN_PAIRS} pairs says 'too few to judge'",
    ),
)


def explain(ran: str) -> list[str]:
    """The lines printed under the summary's tables: what ran (``ran``), what each metric means."""
    return [
        f"what ran: {ran}",
        "what the figures mean:",
        *(f"  {name}: {meaning}" for name, meaning in EXPLAINED),
    ]


def say(msg: str) -> None:
    print(f"demo: {msg}", flush=True)


def fake_trace(path: Path) -> None:
    """Write a trace of simulated commands, tasks interleaved as agents' trajectories are."""
    lines = []
    for i in range(3):
        for task, cands in FAKE_TASKS:
            cand, us = cands[i]
            argv = [
                "python",
                SIMULATED,
                "--task",
                task,
                "--candidate",
                cand,
                "--kernel-us",
                str(us),
                "--reps",
                "30",
                "--setup-ms",
                "1500",
            ]
            band = "<0.1ms" if us < 100 else "0.1-1ms" if us < 1000 else "1-10ms"
            lines.append({"argv": argv, "task": task, "candidate": cand, "band": band})
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))


def replay(env: dict[str, str], *args: str) -> None:
    cmd = [sys.executable, "-m", "krex_cli", "replay", *args]
    rc = subprocess.run(cmd, env=env, cwd=REPO).returncode
    if rc != 0:
        raise SystemExit(f"demo: krex replay failed (exit {rc}): {' '.join(args)}")


@dataclass
class Setup:
    """What the demo replays and how: the trace, the environment, each mode's flags."""

    trace: Path
    env: dict[str, str]
    what: str  # the commands, in words (the "what ran" line)
    native_args: list[str] = field(default_factory=list)  # no krexd: --fake-gpus means nothing
    krex_args: list[str] = field(default_factory=list)  # its krexd's simulated GPU, if any

    @property
    def simulated(self) -> bool:
        """True when the commands run on the fake CUDA driver."""
        return bool(self.krex_args)


def main() -> int:
    """Run the short replay; 0 on success."""
    if os.geteuid() != 0:
        say(
            "krexd manages cgroups and must run as root: run `make demo` as root, or as a user "
            "who may use sudo (make runs this step through sudo then)"
        )
        return 77
    work = Path(tempfile.mkdtemp(prefix="krex-demo-"))
    try:
        setup = _setup(work)
        if setup is None:
            return 1
        report = _replay_both(setup, work)
        _print_summary(setup, report)
    finally:
        hand_over(work)
    if setup.simulated:
        say(
            "simulated device: kernels are timed on the host clock of a small shared "
            "machine, so read throughput here; fidelity is measured on a GPU "
            "(docs/bench/replay-h200.md)"
        )
    say(f"full report with plots: {report}/report.md (this run's files stay in {work})")
    return 0


def hand_over(work: Path) -> None:
    """Give the run's files to the user who ran the demo through sudo (``SUDO_UID``), so
    that the report it points at opens; as root itself, they stay root's."""
    uid, gid = os.environ.get("SUDO_UID", ""), os.environ.get("SUDO_GID", "")
    if os.geteuid() != 0 or not uid.isdigit() or not gid.isdigit():
        return
    for path in [work, *work.rglob("*")]:
        os.chown(path, int(uid), int(gid), follow_symlinks=False)


def _setup(work: Path) -> Setup | None:
    """The GPU trace on a GPU host, else simulated commands on the fake driver (None:
    neither is available; the reason is said)."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO), str(REPO / "python_client"), env.get("PYTHONPATH", "")) if p
    )
    trace = work / "trace.jsonl"
    if count_gpus() > 0:
        say(f"GPU found: replaying the first {GPU_COMMANDS} commands of {GPU_TRACE.name}")
        with GPU_TRACE.open() as f:
            trace.write_text("".join(f.readlines()[:GPU_COMMANDS]))
        what = (
            f"the first {GPU_COMMANDS} commands of {GPU_TRACE.relative_to(REPO)} "
            "(PyTorch, Triton and CuPy candidates, each timing its kernel)"
        )
        return Setup(trace, env, what)
    if not (FAKE_DRIVER / "libcuda.so.1").is_file():
        say("no GPU and no fake driver: run `make` first")
        return None
    fake = str(FAKE_DRIVER)
    say(
        "no GPU on this host: replaying simulated benchmarks over the fake CUDA "
        f"driver ({fake}); krexd runs with --fake-gpus 1"
    )
    fake_trace(trace)
    what = (
        f"{sum(len(c) for _, c in FAKE_TASKS)} commands `python {SIMULATED} --task T "
        "--candidate C --kernel-us US --reps 30`, each timing a simulated kernel 30 times "
        f"({len(FAKE_TASKS)} tasks of 3 candidates)"
    )
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (fake, env.get("LD_LIBRARY_PATH")) if p)
    env["KREX_FAKE_STATE"] = str(work / "fakecuda-state")
    return Setup(trace, env, what, native_args=["--gpus", "0"], krex_args=["--fake-gpus", "1"])


def _replay_both(setup: Setup, work: Path) -> Path:
    """Replay natively, then through krex at concurrency 4; the report's directory."""
    trace = str(setup.trace)
    say("1/2 native: one command at a time, no krex")
    native = ["--mode", "native", *setup.native_args]
    replay(setup.env, trace, *native, "--no-report", "--out", str(work / "1-native"))
    say("2/2 krex: 4 commands at a time, critical regions enforced")
    krex = ["--mode", "krex", "--concurrency", "4", *setup.krex_args]
    replay(setup.env, trace, *krex, "--no-report", "--out", str(work / "2-krex"))
    report = work / "report"
    runs = [str(work / "1-native"), str(work / "2-krex")]
    replay(setup.env, "report", *runs, "--out", str(report))
    return report


def _print_summary(setup: Setup, report: Path) -> None:
    """The report's summary tables, then what ran and what the figures mean."""
    text = (report / "report.md").read_text()
    summary = text.split("## Timing fidelity (mean")[0]
    lines = [ln for ln in summary.split("\n")[2:] if not ln.startswith("![")]  # no image links
    print("\n" + "\n".join(lines).rstrip("\n") + "\n")
    native_flags = "".join(f" {a}" for a in setup.native_args)
    flags = "".join(f" {a}" for a in setup.krex_args)
    ran = (
        f"{setup.what}, replayed with `krex replay TRACE --mode native{native_flags}` and then "
        f"`krex replay TRACE --mode krex --concurrency 4{flags}` (TRACE: {setup.trace})"
    )
    print("\n".join(explain(ran)) + "\n")


if __name__ == "__main__":
    sys.exit(main())
