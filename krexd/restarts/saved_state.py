"""krexd's saved state: what a restarted krexd needs to adopt the tenants of the one before.

Two slots written in place by turns, each a JSON document with a CRC
trailer; :func:`load` takes the newest intact one and refuses
(:class:`StateRefused`) a corrupt, foreign or newer state.  Why in place and
without ``fsync``, and what a state holds: docs/design/daemon.md "Restarts";
the document's layout: :class:`StateFile`.
"""

from __future__ import annotations

import json
import os
import time
import zlib
from typing import Any

FORMAT = "krexd-state"
VERSION = 1
# Larger than any state krexd writes: at most every slot's tenant (argv capped by
# [admission] max_argv_bytes, JSON-escaped) and the GPUs; a state is never refused for
# a size krexd itself can write.  The directory is root's alone (krexd/system/safe_dirs.py).
MAX_BYTES = 4 << 30
ALT_SUFFIX = ".alt"  # the second slot: <path>.alt
_TRAILER = b"krexd-state-end"
_HEAD = b'{"format":"%s","version":%d,' % (FORMAT.encode(), VERSION)
PAD_MAX = 4096  # a slot written shorter is padded with newlines up to this many bytes


class StateRefused(Exception):
    """The saved state cannot be adopted; the message says why (corrupt, foreign, newer)."""


def path_for(state_dir: str, cgroup_name: str) -> str:
    """The state file of the cgroup tree named ``cgroup_name`` under ``state_dir``."""
    return os.path.join(state_dir, f"{cgroup_name}.state")


class StateFile:
    """The writer of one tree's saved state: two slots, written in place by turns.

    ``path`` is :func:`path_for`'s; the slots are ``path`` and ``path + ".alt"``
    (created mode 0600 at the first write, kept open).  Not thread-safe: krexd
    writes from its event loop only.

    A slot is the JSON document, a newline and a trailer line
    ``krexd-state-end <crc32> <length>``; one written shorter than it was is
    padded with newlines to its length in the same write (the reader strips
    them) rather than cut by an ``ftruncate``, unless the gap exceeds
    :data:`PAD_MAX` or the document's own length.  A plain JSON file (the
    single-file format of earlier krexd versions) is read as the oldest slot.
    The document::

        {"format": "krexd-state", "version": 1,
         "cgroup_root": str,            # the tree it describes (a foreign state is refused)
         "pid": int, "saved_at": float, # the krexd that wrote it; wall-clock s
         "seq": int,                    # CLOCK_MONOTONIC ns at the write (newest slot wins)
         "next_tenant_id": int,
         "gpus": {"<index>": {"epoch": int, "gate": str|null,
                              "uuid": str,       # the GPU at that index (absent before 0.1.1)
                              "region": {"tenant", "epoch", "pid", "tid", "siblings": [int],
                                         "thread_cpus": [int] | null,
                                         "request": str | null} | null,
                              "exited": {"<tenant>": epoch}}},
         "tenants": [{"id", "token", "gpu", "argv", "launcher_pid", "launcher_start",
                      "uid", "gid", "exclusive", "without_mps",
                      "cgroup": {"freezer", "cpuset", "kind", "cores": [int]},
                      "pids": [int], "state", "kill_reason", "slots_fd": int | null,
                      "memory": {TenantMemory fields}}]}

    ``launcher_start`` (``/proc/<pid>/stat`` field 22) with the pid names the
    launcher, so a reused pid is never adopted as one; ``slots_fd`` is the
    launcher's fd of the tenant's slot memory (null before ``place`` or
    without a gate), opened again as ``/proc/<launcher>/fd/<slots_fd>``.  A
    tenant's ``state`` is its resting state (``freezing``, ``frozen`` and
    ``thawing`` saved as ``running``), so a region entry or exit changes only
    the holder's record and its GPU's.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._fds: list[int | None] = [None, None]
        self._lengths: list[int | None] = [None, None]  # bytes each slot holds (None: unknown)
        self._next = 0  # the slot the next write goes to
        self._seq = 0

    def write(self, doc: dict[str, Any]) -> None:
        """Write ``doc`` (format, version and ``seq`` added) to the older slot.

        Raises OSError when the directory is not writable or the disk is full;
        the other slot then still holds the newest complete state.
        """
        self._seq = max(time.monotonic_ns(), self._seq + 1)
        self._put(encode({"format": FORMAT, "version": VERSION, **doc, "seq": self._seq}))

    def write_members(self, members: bytes) -> None:
        """Write a document given as its members' JSON text to the older slot.

        ``members``: ``"key":value`` pairs joined by commas, without braces
        and without ``format``, ``version`` and ``seq`` (added here); what
        ``json.dumps(doc, separators=(",", ":"))[1:-1]`` gives for a non-empty
        ``doc``.  Lets the caller assemble the text from pieces it encoded
        earlier (krexd/restarts/state_fragments.py).  Raises OSError as :meth:`write`.
        """
        self._seq = max(time.monotonic_ns(), self._seq + 1)
        self._put(frame(_HEAD + members + b',"seq":%d}' % self._seq))

    def _put(self, data: bytes) -> None:
        """Write one slot's bytes (:func:`frame`'s) to the older slot, in place."""
        slot = self._next
        fd = self._fds[slot]
        if fd is None:
            name = self.path + (ALT_SUFFIX if slot else "")
            flags = os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW
            fd = self._fds[slot] = os.open(name, flags, 0o600)
        known = self._lengths[slot]
        # Shorter than what the slot holds: newlines up to its length, in the same
        # write, cover the older state's tail without an ftruncate (the reader strips
        # them before it reads the trailer).  A large gap is cut instead, so that a slot
        # stays within PAD_MAX (and twice the document) of its state.
        gap = known - len(data) if known is not None else 0
        cut = known is None or gap > min(PAD_MAX, len(data))
        if gap > 0 and not cut:
            data += b"\n" * gap
        # Unknown until this write completes: a write that fails part-way (a full disk)
        # may have grown the file past what the slot held, and the next one must cut it.
        # A krexd killed part-way leaves text of the older state after the new bytes
        # (padding or not): the last line is then that state's trailer or a piece of its
        # text, whose CRC-32 and length do not match what precedes it, and the slot reads
        # as torn (a padded write cut at every byte is tested to read so).
        self._lengths[slot] = None
        view, offset = memoryview(data), 0
        while offset < len(data):
            offset += os.pwrite(fd, view[offset:], offset)
        if cut:  # cut what an older, longer state (or a failed write) left
            os.ftruncate(fd, len(data))
        self._lengths[slot] = len(data)
        self._next = 1 - slot  # only a complete write moves on: a torn slot is rewritten

    def close(self) -> None:
        """Close the slots' descriptors (the files stay)."""
        for i, fd in enumerate(self._fds):
            if fd is not None:
                os.close(fd)
                self._fds[i] = None
                self._lengths[i] = None


def encode(doc: dict[str, Any]) -> bytes:
    """One slot's bytes: ``doc`` as JSON, a newline, the trailer line (length and CRC-32)."""
    return frame(json.dumps(doc, separators=(",", ":")).encode())


def frame(body: bytes) -> bytes:
    """One slot's bytes for the JSON document ``body``: it, a newline, the trailer line."""
    return body + b"\n" + _TRAILER + b" %08x %d\n" % (zlib.crc32(body), len(body))


def _decode(name: str, raw: bytes) -> dict[str, Any] | None:
    """A slot's document, or None when it is torn (trailer missing or wrong, or not JSON).

    A plain JSON document with no trailer (earlier krexd versions) is read
    with ``seq`` 0.  Raises StateRefused for a slot larger than MAX_BYTES.
    """
    if len(raw) > MAX_BYTES:
        raise StateRefused(f"{name}: corrupt: larger than {MAX_BYTES} bytes")
    body, _, trailer = raw.rstrip(b"\n").rpartition(b"\n")
    fields = trailer.split()
    legacy = not fields or fields[0] != _TRAILER
    if legacy:
        body = raw
    elif (
        len(fields) != 3
        or fields[1] != b"%08x" % zlib.crc32(body)
        or fields[2] != b"%d" % len(body)
    ):
        return None
    try:
        doc = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        return None
    if isinstance(doc, dict) and legacy:
        doc["seq"] = 0
    return doc if isinstance(doc, dict) else None


def newest(path: str) -> tuple[str, dict[str, Any]] | None:
    """The newest intact slot's name and document; None when neither slot exists.

    Raises StateRefused when slots exist but none is intact (not JSON, torn),
    or one cannot be read.
    """
    found: list[tuple[int, str, dict[str, Any]]] = []
    seen = []
    for name in (path, path + ALT_SUFFIX):
        try:
            with open(name, "rb") as f:
                raw = f.read(MAX_BYTES + 1)
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise StateRefused(f"{name}: cannot read: {exc.strerror}") from None
        seen.append(name)
        doc = _decode(name, raw)
        if doc is not None:
            seq = doc.get("seq")
            found.append((seq if isinstance(seq, int) else -1, name, doc))
    if not seen:
        return None
    if not found:
        raise StateRefused(f"{' and '.join(seen)}: corrupt: not JSON, or torn")
    _, name, doc = max(found, key=lambda x: x[0])
    return name, doc


def load(path: str, cgroup_root: str) -> dict[str, Any] | None:
    """The newest intact state saved at ``path`` (either slot) for ``cgroup_root``; None if none.

    Raises:
        StateRefused: corrupt (unreadable, not JSON, wrong shape), foreign
            (another tree or format) or newer (``version`` > :data:`VERSION`).
    """
    found = newest(path)
    if found is None:
        return None
    path, doc = found
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise StateRefused(f"{path}: foreign: not a krexd state file")
    version = doc.get("version")
    if not isinstance(version, int) or version < 1:
        raise StateRefused(f"{path}: corrupt: bad version {version!r}")
    if version > VERSION:
        raise StateRefused(
            f"{path}: newer: state version {version}, this krexd reads up to {VERSION}"
        )
    if doc.get("cgroup_root") != cgroup_root:
        raise StateRefused(
            f"{path}: foreign: it describes cgroup tree {doc.get('cgroup_root')!r}, "
            f"not {cgroup_root!r}"
        )
    _check_shape(path, doc)
    return doc


def _check_shape(path: str, doc: dict[str, Any]) -> None:
    """Raise StateRefused unless every field adoption reads has the right type."""
    try:
        if not isinstance(doc["next_tenant_id"], int):
            raise TypeError("next_tenant_id")
        for key, g in doc["gpus"].items():
            int(key)
            if not isinstance(g["epoch"], int):
                raise TypeError("epoch")
            r = g.get("region")
            if r is not None and not all(
                isinstance(r[k], int) for k in ("tenant", "epoch", "pid", "tid")
            ):
                raise TypeError("region")
        for t in doc["tenants"]:
            for k in ("id", "gpu", "launcher_pid", "launcher_start", "uid", "gid"):
                if not isinstance(t[k], int):
                    raise TypeError(k)
            if not isinstance(t.get("slots_fd"), (int, type(None))):
                raise TypeError("slots_fd")
            if not isinstance(t["token"], str) or not isinstance(t["cgroup"]["freezer"], str):
                raise TypeError("token/cgroup")
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise StateRefused(f"{path}: corrupt: missing or bad field ({exc})") from None


def remove(path: str) -> None:
    """Delete both slots of the state (after a full stop: nothing is left to adopt)."""
    for name in (path, path + ALT_SUFFIX):
        try:
            os.unlink(name)
        except FileNotFoundError:
            pass


def process_start(pid: int) -> int | None:
    """Start time of process ``pid`` (clock ticks since boot), or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    if fields[0] in ("Z", "X"):
        return None
    return int(fields[19])
