"""The benchmarking corpus: scripts compile, list without GPU frameworks, trace is consistent."""

from __future__ import annotations

import json
import py_compile
import subprocess
import sys
from pathlib import Path

import pytest

from krex_cli.replay import trace

ROOT = Path(__file__).resolve().parents[3]
WL = ROOT / "workloads"
sys.path.insert(0, str(WL))

import corpus  # noqa: E402
import make_trace  # noqa: E402


def test_every_script_compiles() -> None:
    scripts = sorted(WL.rglob("*.py"))
    assert len(scripts) >= len(corpus.FAMILIES) + 3
    for path in scripts:
        py_compile.compile(str(path), doraise=True)


@pytest.fixture(scope="module")
def listings() -> dict[str, dict[str, object]]:
    # This interpreter has no torch/triton/cupy: --list must not import them.
    return {fam: corpus.listing(fam) for fam in corpus.FAMILIES}


def test_listings_cover_the_corpus(listings: dict[str, dict[str, object]]) -> None:
    tasks = [t for doc in listings.values() for t in doc["tasks"]]  # type: ignore[attr-defined]
    n_cmds = sum(len(t["candidates"]) for t in tasks)
    assert n_cmds >= 40
    assert len({t["task"] for t in tasks}) == len(tasks), "task names must be unique"
    for t in tasks:
        assert len(t["candidates"]) >= 3, t["task"]
        assert t["band"] in trace.BAND_NAMES
    # Every duration band is represented, from ~10 us kernels to >= 10 ms ones.
    assert {t["band"] for t in tasks} == set(trace.BAND_NAMES)


def test_trace_names_existing_scripts_tasks_candidates(
    listings: dict[str, dict[str, object]],
) -> None:
    entries = trace.load(WL / "trace.jsonl")
    assert len(entries) >= 40
    known = {
        (fam, t["task"], c): t["band"]
        for fam, doc in listings.items()
        for t in doc["tasks"]  # type: ignore[attr-defined]
        for c in t["candidates"]
    }
    for e in entries:
        assert e.argv[0] == "python" and e.argv[1].startswith("workloads/")
        script = ROOT / e.argv[1]
        assert script.is_file(), e.argv
        fam = script.stem
        assert e.argv[2:] == ("--task", e.task, "--candidate", e.candidate)
        assert (fam, e.task, e.candidate) in known, e.argv
        assert known[(fam, e.task, e.candidate)] == e.band
    # Every candidate of the corpus is in the trace at least once.
    assert {(ROOT / e.argv[1]).stem for e in entries} == set(corpus.FAMILIES)
    assert len({(e.task, e.candidate) for e in entries}) == len(known)
    # Mixed order: most consecutive commands belong to different tasks.
    switches = sum(1 for a, b in zip(entries, entries[1:], strict=False) if a.task != b.task)
    assert switches >= 0.8 * (len(entries) - 1)


# make_trace runs in this process: the families' listings (a Python process each) are
# read once, by the ``listings`` fixture or the first of these, for all of them.
def test_committed_trace_is_current(tmp_path: Path, listings: object) -> None:
    out = tmp_path / "trace.jsonl"
    assert make_trace.main(["--out", str(out)]) == 0
    assert out.read_text() == (WL / "trace.jsonl").read_text(), (
        "workloads/trace.jsonl is stale: run python workloads/make_trace.py"
    )


def test_committed_compile_mix_is_current(tmp_path: Path, listings: object) -> None:
    out = tmp_path / "mix.jsonl"
    mix_args = ["--mix", str(WL / "trace-h200.jsonl"), "--compile-copies", "2"]
    assert make_trace.main([*mix_args, "--out", str(out)]) == 0
    assert out.read_text() == (WL / "trace-compile-mix.jsonl").read_text(), (
        "workloads/trace-compile-mix.jsonl is stale: see python workloads/make_trace.py --help"
    )
    mix = trace.load(out)
    base = trace.load(WL / "trace-h200.jsonl")
    compiled = [e for e in mix if e.candidate == "torch_compile"]
    # every compiled candidate of the corpus twice, beside the whole base trace
    assert len(mix) == len(base) + 2 * sum(
        1 for c in corpus.commands() if c["candidate"] == "torch_compile"
    )
    assert len({e.task for e in compiled}) >= 5


def test_interleave_keeps_each_trajectory_in_order() -> None:
    cmds = [{"task": t, "candidate": str(i)} for t in "abc" for i in range(4)]
    out = make_trace.interleave(cmds, seed=1, reruns=0.0)
    assert sorted((c["task"], c["candidate"]) for c in out) == sorted(
        (c["task"], c["candidate"]) for c in cmds
    )
    assert make_trace.interleave(cmds, seed=1, reruns=0.0) == out  # seeded


def test_bad_arguments_exit_2_without_gpu() -> None:
    for args, msg in (
        (["--task", "gemm_bf16_4096", "--candidate", "nope"], "has no candidate 'nope'"),
        (["--task", "nope", "--candidate", "torch"], "invalid choice"),
        (["--task", "gemm_bf16_4096"], "--task and --candidate are required"),
        (["--task", "gemm_bf16_4096", "--candidate", "torch", "--device", "cpu"], "--smoke"),
    ):
        p = subprocess.run(
            [sys.executable, str(WL / "gemm.py"), *args], capture_output=True, text=True
        )
        assert p.returncode == 2 and msg in p.stderr, (args, p.stderr)


def test_harness_compare_and_listing() -> None:
    import harness

    doc = harness.listing("x", [harness.Task("t", "<0.1ms", ("a", "b", "c"), about="why")])
    assert json.loads(json.dumps(doc)) == {
        "family": "x",
        "tasks": [{"task": "t", "band": "<0.1ms", "candidates": ["a", "b", "c"], "about": "why"}],
    }
    with pytest.raises(ValueError, match="band"):
        harness.Task("t", "slow", ("a", "b", "c"))
    with pytest.raises(ValueError, match=">= 3 distinct"):
        harness.Task("t", "<0.1ms", ("a", "a", "b"))
