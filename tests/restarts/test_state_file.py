"""krexd's saved state on disk: two slots written in place, the newest intact one wins.

Root-free: plain files in a temporary directory.  A torn slot (a krexd killed
mid-write, a full disk) must leave the previous state readable; a file of the
earlier single-file format must still be adopted after an upgrade.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from krexd.restarts import saved_state

ROOT = "/sys/fs/cgroup/krex-test"


def _doc(n: int) -> dict[str, object]:
    # "a" comes first: documents of different n differ from their first doc bytes on.
    return {"a": str(n) * 64, "cgroup_root": ROOT, "next_tenant_id": n, "gpus": {}, "tenants": []}


def test_writes_alternate_and_the_newest_is_loaded(tmp_path: Path) -> None:
    path = str(tmp_path / "k.state")
    f = saved_state.StateFile(path)
    for n in (1, 2, 3):
        f.write(_doc(n))
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 3
    # Both slots exist and hold complete states: 3 in the main file, 2 in the other.
    assert os.path.exists(path) and os.path.exists(path + saved_state.ALT_SUFFIX)
    found = saved_state.newest(path)
    assert found is not None and found[0] == path


def test_a_shorter_state_over_a_longer_one_leaves_no_tail(tmp_path: Path) -> None:
    """A slot is cut only when the new state is shorter: what is left must never be read."""
    path = str(tmp_path / "k.state")
    f = saved_state.StateFile(path)
    long = {**_doc(1), "tenants": [{"id": i, "argv": ["x" * 200]} for i in range(20)]}
    f.write(long)  # main slot
    f.write(long)  # alt slot
    f.write(_doc(3))  # main slot again, much shorter
    assert os.path.getsize(path) < len(json.dumps(long))
    f.write(_doc(4))  # alt slot
    f.close()
    g = saved_state.StateFile(path)  # a restarted krexd: slot lengths unknown again
    g.write(long)
    g.write(_doc(6))
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 6 and loaded["tenants"] == []


def test_a_torn_newest_slot_falls_back_to_the_previous_state(tmp_path: Path) -> None:
    path = str(tmp_path / "k.state")
    f = saved_state.StateFile(path)
    f.write(_doc(1))
    f.write(_doc(2))  # in the .alt slot
    alt = path + saved_state.ALT_SUFFIX
    data = Path(alt).read_bytes()
    # A krexd killed in the middle of its next write to the same slot: a prefix of
    # a newer document over the old bytes.
    newer = saved_state.encode(
        {"format": saved_state.FORMAT, "version": 1, **_doc(9), "seq": 1 << 62}
    )
    assert newer[: len(newer) // 2] != data[: len(newer) // 2]  # the torn part differs
    Path(alt).write_bytes(newer[: len(newer) // 2] + data[len(newer) // 2 :])
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 1


def _write_in_child(path: str, before: str, stopped: dict[str, Any], after: str) -> None:
    """In a child: ``before`` (statements with ``f``, the StateFile of ``path``), a write of
    ``stopped`` cut at 8 KiB by the file size limit (EFBIG, as ENOSPC would), then
    ``after`` with the limit lifted.  The cut write must have failed."""
    prog = textwrap.dedent(
        f"""
        import resource, signal, sys
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        sys.path[:0] = {sys.path!r}
        from krexd.restarts import saved_state
        f = saved_state.StateFile({path!r})
        """
    )
    prog += (
        textwrap.dedent(before)
        + textwrap.dedent(
            f"""
        hard = resource.getrlimit(resource.RLIMIT_FSIZE)[1]
        resource.setrlimit(resource.RLIMIT_FSIZE, (8192, hard))
        try:
            f.write({stopped!r})
        except OSError as exc:
            print("failed", exc.errno)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))
        """
        )
        + textwrap.dedent(after)
    )
    run = subprocess.run([sys.executable, "-c", prog], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith("failed"), run.stdout


def test_a_full_disk_keeps_the_previous_state_and_the_next_write_retries(
    tmp_path: Path,
) -> None:
    path = str(tmp_path / "k.state")
    saved_state.StateFile(path).write(_doc(1))
    big = _doc(2) | {"pad": "x" * 20000}
    _write_in_child(
        path,
        "f._next = 1  # the slot not holding state 1, as the writer that wrote it would\n",
        big,
        f"f.write({_doc(3)!r})  # the same (torn) slot again, now complete\n",
    )
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 3


def test_a_failed_write_over_a_known_slot_is_cut_by_the_next(tmp_path: Path) -> None:
    """A write that fails part-way may grow a slot past the length last written there: the
    next write to it must cut the tail, however long it is (else the newest state is torn)."""
    path = str(tmp_path / "k.state")
    big = _doc(3) | {"pad": "x" * 20000}
    _write_in_child(
        path,
        f"f.write({_doc(1)!r})  # main slot: its length is known from now on\n"
        f"f.write({_doc(2)!r})  # alt slot\n",
        big,  # main slot, stopped at 8 KiB
        f"f.write({_doc(4)!r})  # main slot again: as long as state 1, far shorter than 8 KiB\n",
    )
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 4


def test_the_single_file_format_of_earlier_versions_is_adopted(tmp_path: Path) -> None:
    path = str(tmp_path / "k.state")
    Path(path).write_text(json.dumps({"format": saved_state.FORMAT, "version": 1, **_doc(5)}))
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 5
    # The first write of the new version goes to a slot and wins over the old file.
    f = saved_state.StateFile(path)
    f.write(_doc(6))
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 6


def test_no_intact_slot_is_refused_as_corrupt(tmp_path: Path) -> None:
    path = str(tmp_path / "k.state")
    Path(path).write_bytes(b"{not json")
    Path(path + saved_state.ALT_SUFFIX).write_bytes(b"")
    with pytest.raises(saved_state.StateRefused, match="corrupt"):
        saved_state.load(path, ROOT)


def test_remove_deletes_both_slots(tmp_path: Path) -> None:
    path = str(tmp_path / "k.state")
    f = saved_state.StateFile(path)
    f.write(_doc(1))
    f.write(_doc(2))
    f.close()
    saved_state.remove(path)
    assert saved_state.load(path, ROOT) is None
    assert not os.listdir(tmp_path)


def _tenants(n: int, width: int = 200) -> list[dict[str, object]]:
    return [{"id": i, "argv": ["x" * width]} for i in range(n)]


def test_a_slot_written_shorter_is_padded_not_cut(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Shorter by up to PAD_MAX: newlines fill the slot in the same write, no ftruncate."""
    path = str(tmp_path / "k.state")
    f = saved_state.StateFile(path)
    f.write({**_doc(1), "tenants": _tenants(10)})
    f.write({**_doc(1), "tenants": _tenants(10)})
    size = os.path.getsize(path)
    cuts: list[int] = []
    truncate = os.ftruncate

    def counting(fd: int, n: int) -> None:
        cuts.append(n)
        truncate(fd, n)

    monkeypatch.setattr(os, "ftruncate", counting)
    for n in (2, 3, 4, 5):  # each shorter than the one before in its slot
        f.write({**_doc(n), "tenants": _tenants(9, 200 - 10 * n)})
        f.write({**_doc(n), "tenants": _tenants(9, 200 - 10 * n)})  # the other slot
    assert cuts == []
    assert os.path.getsize(path) == size
    raw = Path(path).read_bytes()
    assert raw.endswith(b"\n\n") and len(raw.rstrip(b"\n")) < size - 1
    found = saved_state.newest(path)  # its tenants are no real records: no shape check
    assert found is not None and found[1]["next_tenant_id"] == 5
    assert found[1]["tenants"] == _tenants(9, 150)
    # A restarted krexd reads the padded slots, and its first writes cut them (their
    # lengths are unknown to it).
    f.close()
    g = saved_state.StateFile(path)
    g.write(_doc(6))
    assert cuts and os.path.getsize(path) == len(Path(path).read_bytes().rstrip(b"\n")) + 1
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 6


def test_a_much_shorter_state_is_cut(tmp_path: Path) -> None:
    """Padding stops at PAD_MAX bytes and at the document's own length: then the slot is cut."""
    path = str(tmp_path / "k.state")

    def cut() -> bool:  # the slot ends with its trailer's newline, no padding
        raw = Path(path).read_bytes()
        return raw.endswith(b"\n") and not raw.endswith(b"\n\n")

    f = saved_state.StateFile(path)
    f.write({**_doc(1), "tenants": _tenants(100)})
    f.write({**_doc(1), "tenants": _tenants(100)})
    f.write({**_doc(2), "tenants": _tenants(60)})  # shorter by more than PAD_MAX
    assert cut()
    f.write({**_doc(3), "tenants": _tenants(10)})  # alt
    f.write({**_doc(4), "tenants": _tenants(10)})  # shorter by more than PAD_MAX
    f.write(_doc(5))  # alt: by less than PAD_MAX, but by more than its own length
    assert cut()
    f.write(_doc(6))
    assert cut()
    loaded = saved_state.load(path, ROOT)
    assert loaded is not None and loaded["next_tenant_id"] == 6


def test_a_torn_write_over_a_padded_slot_is_never_read_as_a_state(tmp_path: Path) -> None:
    """Killed at any byte of a padded write: the slot reads as the new state or as torn."""
    path = str(tmp_path / "k.state")
    f = saved_state.StateFile(path)
    f.write({**_doc(1), "tenants": _tenants(10)})
    f.write({**_doc(2), "tenants": _tenants(10)})  # alt
    f.write({**_doc(3), "tenants": _tenants(10, 190)})  # main, padded
    f.write({**_doc(4), "tenants": _tenants(10, 190)})  # alt, padded: the previous state
    old = Path(path).read_bytes()
    doc = {**_doc(5), "tenants": _tenants(10, 185)}
    new = saved_state.encode({"format": saved_state.FORMAT, "version": 1, **doc, "seq": 1 << 62})
    assert len(old.rstrip(b"\n")) + 1 > len(new) and old.endswith(b"\n\n")
    padded = new + b"\n" * (len(old) - len(new))
    for k in range(len(padded) + 1):
        torn = padded[:k] + old[k:]
        Path(path).write_bytes(torn)
        found = saved_state.newest(path)
        assert found is not None, k
        # The new state once it and the newlines over the older state's text are written.
        complete = k >= len(new) and not torn[len(new) :].strip(b"\n")
        assert found[1]["next_tenant_id"] == (5 if complete else 4), k
    assert complete and k > len(new)


def test_a_state_larger_than_16_mib_is_adopted(tmp_path: Path) -> None:
    """krexd refused, at its next start, a state it had written itself (18 commands of
    1 MB argv: over the old 16 MiB read limit): every command was killed."""
    path = str(tmp_path / "k.state")
    f = saved_state.StateFile(path)
    big = {**_doc(1), "tenants": [{"id": i, "argv": ["x" * (1 << 20)]} for i in range(18)]}
    f.write(big)
    assert os.path.getsize(path) > 16 << 20
    loaded = saved_state.newest(path)
    assert loaded is not None and len(loaded[1]["tenants"]) == 18
