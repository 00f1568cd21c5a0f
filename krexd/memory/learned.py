"""Learned memory needs: what earlier runs of the same command used sets the need of the next.

Keyed by ``(uid, label)`` (:func:`label_for` derives a label from the
command line), bounded per uid and in all, kept in one versioned JSON file
in the state directory: docs/design/memory.md "5. Learned needs".
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import time
from collections import Counter, OrderedDict
from typing import Any

from krexd.system.atomic_file import write_atomic

_log = logging.getLogger("krexd.memory")

VERSION = 2  # 2: entries keyed by (uid, label); 1 had labels only
KEEP_RUNS = 4  # peaks kept per label; the need is their maximum
MAX_LABEL = 512  # characters; longer labels keep a prefix and a digest

_PYTHON = re.compile(r"^(python|pypy)[\d.]*$")
_PY_OPTS_WITH_VALUE = ("-W", "-X", "-Q")


def label_for(argv: list[str]) -> str:
    """The default label of a command line: its script (or ``-m module``) and arguments.

    A leading Python interpreter and its options are dropped, so that
    ``python3 -u bench.py --n 4096`` and ``python bench.py --n 4096`` share
    one label (``bench.py --n 4096``); other commands keep their whole
    command line.  Labels longer than ``MAX_LABEL`` characters end in a digest.
    """
    args = list(argv)
    if args and _PYTHON.match(os.path.basename(args[0])):
        i = 1
        while i < len(args) and args[i].startswith("-") and args[i] != "-":
            if args[i] in ("-m", "-c"):
                break
            i += 2 if args[i] in _PY_OPTS_WITH_VALUE else 1
        args = args[i:] or args[:1]
    label = " ".join(args)
    if len(label) > MAX_LABEL:
        digest = hashlib.sha256(label.encode()).hexdigest()[:16]
        label = f"{label[: MAX_LABEL - 18]}..{digest}"
    return label


class LearnedNeeds:
    """Peaks of earlier runs per ``(uid, label)``, kept in ``path`` (None: in memory only).

    Args:
        path: the JSON file in the state directory.
        max_labels: entries kept at most, all uids together.
        max_per_uid: entries kept at most per uid (``[memory] learned_per_uid``).
    """

    def __init__(self, path: str | None, max_labels: int, max_per_uid: int = 256) -> None:
        self.path = path
        self.max_labels = max_labels
        self.max_per_uid = max_per_uid
        self._peaks: OrderedDict[tuple[int, str], list[int]] = OrderedDict()  # oldest use first
        self._per_uid: Counter[int] = Counter()

    def load(self) -> None:
        """Read the file; a missing one means nothing learned yet.

        An unreadable file or one of another version is renamed to
        ``<path>.bad`` (kept for inspection) and learning starts afresh.
        """
        if self.path is None:
            return
        try:
            with open(self.path, "rb") as f:
                doc = json.load(f)
            if not isinstance(doc, dict) or doc.get("version") != VERSION:
                raise ValueError(f"version {doc.get('version') if isinstance(doc, dict) else '?'}")
            for uid, label, peaks in doc["labels"]:
                if _valid_entry(uid, label, peaks):
                    self._put((uid, label), list(peaks)[-KEEP_RUNS:])
        except FileNotFoundError:
            return
        except (OSError, ValueError, KeyError, TypeError) as exc:
            _log.warning("learned memory needs: %s unusable (%s); starting afresh", self.path, exc)
            self._peaks.clear()
            self._per_uid.clear()
            try:
                os.replace(self.path, self.path + ".bad")
            except OSError:
                pass
            return
        _log.info("learned memory needs: %d label(s) from %s", len(self._peaks), self.path)

    def need(self, uid: int, label: str) -> int | None:
        """Bytes learned for ``label`` of ``uid`` (largest recent peak), or None; marks it used."""
        peaks = self._peaks.get((uid, label))
        if not peaks:
            return None
        self._peaks.move_to_end((uid, label))
        return max(peaks)

    def record(self, uid: int, label: str, peak_bytes: int) -> None:
        """Add one run's peak (bytes) under ``label`` of ``uid`` and save the table."""
        if not label or peak_bytes <= 0:
            return
        peaks = self._pop((uid, label)) or []
        peaks.append(int(peak_bytes))
        self._put((uid, label), peaks[-KEEP_RUNS:])
        self.save()

    def labels_of(self, uid: int) -> list[str]:
        """Labels kept for ``uid``, least recently used first."""
        return [label for u, label in self._peaks if u == uid]

    def _put(self, key: tuple[int, str], peaks: list[int]) -> None:
        """Store ``key`` as the most recently used, then evict to the bounds (memory.md §5)."""
        self._pop(key)
        uid = key[0]
        while self._per_uid[uid] >= self.max_per_uid:
            self._pop(next(k for k in self._peaks if k[0] == uid))
        while len(self._peaks) >= self.max_labels:
            most = max(self._per_uid, key=lambda u: self._per_uid[u])
            self._pop(next(k for k in self._peaks if k[0] == most))
        self._peaks[key] = peaks
        self._per_uid[uid] += 1

    def _pop(self, key: tuple[int, str]) -> list[int] | None:
        peaks = self._peaks.pop(key, None)
        if peaks is not None:
            self._per_uid[key[0]] -= 1
            if not self._per_uid[key[0]]:
                del self._per_uid[key[0]]
        return peaks

    def save(self) -> None:
        """Write the table (atomically); errors are logged, learning goes on in memory."""
        if self.path is None:
            return
        doc = {
            "version": VERSION,
            "saved_at": time.time(),
            "labels": [[uid, label, peaks] for (uid, label), peaks in self._peaks.items()],
        }
        try:
            write_atomic(self.path, json.dumps(doc, separators=(",", ":")).encode())
        except OSError as exc:
            _log.error("learned memory needs: cannot write %s: %s", self.path, exc)

    def __len__(self) -> int:
        return len(self._peaks)

    def status(self) -> dict[str, Any]:
        """JSON-ready summary: labels kept, bounds, file."""
        return {
            "labels": len(self._peaks),
            "max_labels": self.max_labels,
            "max_per_uid": self.max_per_uid,
            "path": self.path,
        }


def _valid_entry(uid: Any, label: Any, peaks: Any) -> bool:
    """True for one well-formed saved entry: uid ≥ 0, a label, peaks ≥ 0 (bytes)."""
    return (
        isinstance(uid, int)
        and not isinstance(uid, bool)
        and uid >= 0
        and isinstance(label, str)
        and isinstance(peaks, list)
        and all(isinstance(p, int) and p >= 0 for p in peaks)
    )
