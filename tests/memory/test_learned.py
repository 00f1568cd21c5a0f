"""Learned memory needs (krexd/memory/learned.py) and what admission charges (root-free).

* labels: a Python interpreter and its options do not change a command's label;
* the table: the largest of the last runs' peaks, least recently used labels
  dropped beyond the bound, saved atomically, read back by a new instance (a
  restart), an unusable file set aside;
* ``AdmissionPolicy.need_for``: max(declared, learned, default), with the source named.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from krexd.config.config import MemoryConfig
from krexd.hardware.inventory import GpuInfo
from krexd.memory.learned import KEEP_RUNS, VERSION, LearnedNeeds, label_for
from krexd.memory.policy import AdmissionPolicy
from krexd.memory.view import GpuMemory, GpuView
from krexd.memory.views import MemoryViews
from krexd.tenancy.admission import GpuSlots
from krexd.tenancy.tenants import TenantRegistry

G = 1 << 30
U = 1000  # the uid of the tables' entries


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
    assert a.need(U, "bench") is None
    for peak in (5 * G, 9 * G, *[1 * G] * (KEEP_RUNS - 1)):
        a.record(U, "bench", peak)
    assert a.need(U, "bench") == 9 * G, "the largest of the last KEEP_RUNS runs"
    a.record(U, "bench", 1 * G)
    assert a.need(U, "bench") == 1 * G, "9 GiB fell out of the last KEEP_RUNS runs"
    a.record(U, "bench", 3 * G)
    b = LearnedNeeds(path, max_labels=10)  # a restarted krexd
    b.load()
    assert b.need(U, "bench") == 3 * G
    doc = json.loads(Path(path).read_text())
    assert doc["version"] == VERSION
    assert [p for p in os.listdir(tmp_path) if p != "learned.json"] == [], "no temporary left"


def test_least_recently_used_labels_are_dropped(tmp_path: Path) -> None:
    path = str(tmp_path / "learned.json")
    a = LearnedNeeds(path, max_labels=3)
    for name in ("a", "b", "c"):
        a.record(U, name, G)
    assert a.need(U, "a") == G  # a used: b is now the least recently used
    a.record(U, "d", G)
    assert (a.need(U, "b"), len(a)) == (None, 3)
    b = LearnedNeeds(path, max_labels=3)
    b.load()
    assert {n for n in "abcd" if b.need(U, n)} == {"a", "c", "d"}


def test_a_file_of_another_version_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    path.write_text(json.dumps({"version": VERSION + 1, "labels": [[U, "x", [G]]]}))
    a = LearnedNeeds(str(path), max_labels=3)
    a.load()
    assert a.need(U, "x") is None
    assert (tmp_path / "learned.json.bad").exists() and not path.exists()
    a.record(U, "y", G)
    assert json.loads(path.read_text())["labels"] == [[U, "y", [G]]]


def test_one_user_can_neither_raise_nor_evict_another_users_need(tmp_path: Path) -> None:
    path = str(tmp_path / "learned.json")
    a = LearnedNeeds(path, max_labels=100, max_per_uid=3)
    a.record(U, "bench", 2 * G)
    a.record(U, "other", G)
    a.record(666, "bench", 70 * G)  # same label, another uid
    assert (a.need(U, "bench"), a.need(666, "bench")) == (2 * G, 70 * G)
    for i in range(50):  # uid 666 churns labels: only its own are evicted
        a.record(666, f"junk{i}", G)
    assert a.need(U, "bench") == 2 * G and a.need(U, "other") == G
    assert a.labels_of(666) == ["junk47", "junk48", "junk49"]
    assert len(a) == 5 and a.status()["max_per_uid"] == 3
    b = LearnedNeeds(path, max_labels=100, max_per_uid=3)  # a restart keeps the keys
    b.load()
    assert (b.need(U, "bench"), b.need(666, "bench")) == (2 * G, None)


def test_beyond_max_labels_the_uid_holding_the_most_loses_one(tmp_path: Path) -> None:
    a = LearnedNeeds(None, max_labels=4, max_per_uid=10)
    a.record(U, "mine", G)
    for name in ("x", "y", "z", "w"):
        a.record(666, name, G)
    assert a.need(U, "mine") == G and a.labels_of(666) == ["y", "z", "w"]


def test_a_label_only_version_1_file_is_set_aside(tmp_path: Path) -> None:
    path = tmp_path / "learned.json"
    path.write_text(json.dumps({"version": 1, "labels": [["bench", [70 * G]]]}))
    a = LearnedNeeds(str(path), max_labels=3)
    a.load()
    assert a.need(U, "bench") is None and a.need(0, "bench") is None and len(a) == 0
    assert (tmp_path / "learned.json.bad").exists() and not path.exists()


class _Gpu:
    def __init__(self, total: int) -> None:
        self.info = GpuInfo(0, "fake", total, 0, None, True)
        self.gate = None
        self.memory = GpuMemory(view=GpuView(total, 0, 0, 0, 0, "fake"))
        self.slots = GpuSlots(0, 4)


def _policy(tmp_path: Path, **cfg: Any) -> tuple[AdmissionPolicy, LearnedNeeds]:
    learned = LearnedNeeds(str(tmp_path / "l.json"), 100)
    gpus = [_Gpu(80 * G)]
    policy = AdmissionPolicy(
        MemoryConfig(headroom=0, default_need=1 * G, **cfg),
        MemoryViews(gpus, TenantRegistry()),
        gpus,
        learned,
    )
    return policy, learned


def test_admission_charges_the_largest_of_declared_learned_default(tmp_path: Path) -> None:
    m, learned = _policy(tmp_path)
    argv = ["python", "bench.py", "--big"]
    rec = m.need_for(None, None, argv, uid=U)
    assert (rec.need_bytes, rec.need_source, rec.label) == (G, "default", "bench.py --big")
    learned.record(U, "bench.py --big", 56 * G)
    rec = m.need_for(None, None, argv, uid=U)
    assert (rec.need_bytes, rec.need_source, rec.learned_bytes) == (56 * G, "learned", 56 * G)
    rec = m.need_for(60 * G, None, argv, uid=U)
    assert (rec.need_bytes, rec.need_source, rec.declared_bytes) == (60 * G, "declared", 60 * G)
    rec = m.need_for(10 * G, None, argv, uid=U)
    assert (rec.need_bytes, rec.need_source) == (56 * G, "learned")
    assert m.need_for(None, None, argv, label="other", uid=U).need_source == "default"
    learned.record(U, "huge", 500 * G)
    assert m.need_for(None, None, ["x"], label="huge", uid=U).need_bytes == 80 * G, (
        "capped at the card"
    )
    off, _ = _policy(tmp_path, learn=False)
    assert off.need_for(None, None, argv, uid=U).need_source == "default"


def test_admission_charges_only_the_callers_own_learned_need(tmp_path: Path) -> None:
    m, learned = _policy(tmp_path)
    argv = ["python", "bench.py"]
    learned.record(666, "bench.py", 70 * G)
    assert m.need_for(None, None, argv, uid=U).need_source == "default"
    assert m.need_for(None, None, argv, uid=666).need_bytes == 70 * G
