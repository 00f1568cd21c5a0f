"""Learned memory needs (krexd/memory/learned.py) and what admission charges (root-free).

* labels: a Python interpreter and its options do not change a command's label;
* the table: the largest of the last runs' peaks, least recently used labels
  dropped beyond the bound, saved atomically, read back by a new instance (a
  restart), an unusable file set aside;
* ``MemoryMonitor.need_for``: max(declared, learned, default), with the source named.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from krexd.admission import Admission, GpuSlots
from krexd.config import MemoryConfig
from krexd.gpus import GpuInfo
from krexd.memory.learned import KEEP_RUNS, VERSION, LearnedNeeds, label_for
from krexd.memory.monitor import MemoryMonitor
from krexd.memory.view import GpuMemory, GpuView
from krexd.runtime import Runtime
from krexd.tenants import TenantRegistry

G = 1 << 30


def test_labels_are_the_script_and_its_arguments() -> None:
    assert label_for(["python3", "-u", "bench.py", "--n", "4096"]) == "bench.py --n 4096"
    assert label_for(["/usr/bin/python3.11", "bench.py", "--n", "4096"]) == "bench.py --n 4096"
    assert label_for(["python", "-X", "dev", "bench.py"]) == "bench.py"
    assert label_for(["python", "-m", "pkg.bench", "-k", "2"]) == "-m pkg.bench -k 2"
    assert label_for(["./run.sh", "a"]) == "./run.sh a"
    long = label_for(["bench.py", "x" * 2000])
    assert len(long) == 512 and long != label_for(["bench.py", "x" * 1999])


def test_need_is_the_largest_recent_peak_and_survives_a_restart(tmp_path: Path) -> None:
    path = str(tmp_path / "learned.json")
    a = LearnedNeeds(path, max_labels=10)
    a.load()  # no file yet: nothing learned
    assert a.need("bench") is None
    for peak in (5 * G, 9 * G, *[1 * G] * (KEEP_RUNS - 1)):
        a.record("bench", peak)
    assert a.need("bench") == 9 * G, "the largest of the last KEEP_RUNS runs"
    a.record("bench", 1 * G)
    assert a.need("bench") == 1 * G, "9 GiB fell out of the last KEEP_RUNS runs"
    a.record("bench", 3 * G)
    b = LearnedNeeds(path, max_labels=10)  # a restarted krexd
    b.load()
    assert b.need("bench") == 3 * G
    doc = json.loads(Path(path).read_text())
    assert doc["version"] == VERSION
    assert [p for p in os.listdir(tmp_path) if p != "learned.json"] == [], "no temporary left"


def test_least_recently_used_labels_are_dropped(tmp_path: Path) -> None:
    path = str(tmp_path / "learned.json")
    a = LearnedNeeds(path, max_labels=3)
    for name in ("a", "b", "c"):
        a.record(name, G)
    assert a.need("a") == G  # a used: b is now the least recently used
    a.record("d", G)
    assert (a.need("b"), len(a)) == (None, 3)
    b = LearnedNeeds(path, max_labels=3)
    b.load()
    assert {n for n in "abcd" if b.need(n)} == {"a", "c", "d"}


def test_a_file_of_another_version_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    path.write_text(json.dumps({"version": VERSION + 1, "labels": [["x", [G]]]}))
    a = LearnedNeeds(str(path), max_labels=3)
    a.load()
    assert a.need("x") is None
    assert (tmp_path / "learned.json.bad").exists() and not path.exists()
    a.record("y", G)
    assert json.loads(path.read_text())["labels"] == [["y", [G]]]


class _Gpu:
    def __init__(self, total: int) -> None:
        self.info = GpuInfo(0, "fake", total, 0, None, True)
        self.gate = None
        self.memory = GpuMemory(view=GpuView(total, 0, 0, 0, 0, "fake"))
        self.slots = GpuSlots(0, 4)


def _monitor(tmp_path: Path, **cfg: Any) -> MemoryMonitor:
    learned = LearnedNeeds(str(tmp_path / "l.json"), 100)
    return MemoryMonitor(
        MemoryConfig(headroom=0, default_need=1 * G, **cfg),
        4,
        [_Gpu(80 * G)],
        TenantRegistry(),
        Admission([]),
        Runtime(),
        learned,
    )


def test_admission_charges_the_largest_of_declared_learned_default(tmp_path: Path) -> None:
    m = _monitor(tmp_path)
    argv = ["python", "bench.py", "--big"]
    rec = m.need_for(None, None, argv)
    assert (rec.need_bytes, rec.need_source, rec.label) == (G, "default", "bench.py --big")
    m.learned.record("bench.py --big", 56 * G)
    rec = m.need_for(None, None, argv)
    assert (rec.need_bytes, rec.need_source, rec.learned_bytes) == (56 * G, "learned", 56 * G)
    rec = m.need_for(60 * G, None, argv)
    assert (rec.need_bytes, rec.need_source, rec.declared_bytes) == (60 * G, "declared", 60 * G)
    rec = m.need_for(10 * G, None, argv)
    assert (rec.need_bytes, rec.need_source) == (56 * G, "learned")
    assert m.need_for(None, None, argv, label="other").need_source == "default"
    m.learned.record("huge", 500 * G)
    assert m.need_for(None, None, ["x"], label="huge").need_bytes == 80 * G, "capped at the card"
    off = _monitor(tmp_path, learn=False)
    assert off.need_for(None, None, argv).need_source == "default"
