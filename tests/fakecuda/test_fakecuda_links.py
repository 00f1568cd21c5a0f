"""The three ways programs reach the driver (linked, dlopen+dlsym,
cuGetProcAddress with self-lookup) land on the same functions."""

from __future__ import annotations

import pytest

from . import timeline
from .harness import FakeCuda

LINKS = ("direct", "dlsym", "procaddr")
PER_THREAD = {
    "cuLaunchKernel": "cuLaunchKernel_ptsz",
    "cuStreamSynchronize": "cuStreamSynchronize_ptsz",
    "cuStreamBeginCapture": "cuStreamBeginCapture_v2_ptsz",
    "cuStreamEndCapture": "cuStreamEndCapture_ptsz",
    "cuGraphLaunch": "cuGraphLaunch_ptsz",
}


@pytest.mark.parametrize("per_thread", [False, True], ids=["legacy", "per-thread"])
def test_link_modes_reach_the_same_functions(fc: FakeCuda, per_thread: bool) -> None:
    flags = ["--per-thread"] if per_thread else []
    runs = {
        link: fc.bench("--link", link, "--count", "3", "--kernel-ns", "1000", *flags)
        for link in LINKS
    }
    offsets = {link: {k: v["offset"] for k, v in r["symbols"].items()} for link, r in runs.items()}
    assert offsets["direct"] == offsets["dlsym"] == offsets["procaddr"]
    for r in runs.values():
        assert {v["object"] for v in r["symbols"].values()} == {"libcuda.so.1"}
    names = {k: v["name"] for k, v in runs["procaddr"]["symbols"].items()}
    assert names["cuLaunchKernel"] == ("cuLaunchKernel_ptsz" if per_thread else "cuLaunchKernel")
    for base, pt_name in PER_THREAD.items():
        assert names[base] == (pt_name if per_thread else names[base].replace("_ptsz", ""))
    assert names["cuDevicePrimaryCtxRelease"] == "cuDevicePrimaryCtxRelease_v2"
    assert names["cuStreamBeginCapture"].startswith("cuStreamBeginCapture_v2")
    # Every mode's kernels reached the device.
    per_pid = timeline.by_pid(fc.records())
    assert sorted(len(per_pid[run["pid"]]) for run in runs.values()) == [3, 3, 3]


def test_procaddr_self_lookup_follows_the_version(fc: FakeCuda) -> None:
    assert fc.bench("--link", "procaddr", "--count", "1")["resolver"] == "cuGetProcAddress_v2"
    old = fc.bench("--link", "procaddr", "--count", "1", "--cuda-version", "11030")
    assert old["resolver"] == "cuGetProcAddress"  # the 4-argument ABI, still working
    assert old["launches"] == 1 and old["error"] is None


@pytest.mark.parametrize("per_thread", [False, True], ids=["legacy", "per-thread"])
def test_null_stream_is_legacy_or_per_thread(fc: FakeCuda, per_thread: bool) -> None:
    flags = ["--per-thread"] if per_thread else []
    fc.bench("--link", "procaddr", "--streams", "0", "--count", "2", *flags)
    streams = {r.stream for r in fc.records()}
    # The legacy default stream is id 0; a per-thread default stream has its own id.
    assert streams == ({1} if per_thread else {0})
