"""Holder tenant of the package test: one critical region, observing a sibling.

Usage: ``python3 holder.py SIBLING_FILE OUT_JSON``. Waits until the sibling
(sibling.py) runs, enters ``region.critical()`` for 1 s and samples the
sibling's loop count at entry, at the end of the region, and 0.5 s after
it; also reads the sibling's cgroup ``cgroup.events`` inside the region.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from krex_client import region


def sample(path: Path) -> tuple[int, int]:
    """(pid, count) published by the sibling."""
    pid, count = path.read_text().split()
    return int(pid), int(count)


def cgroup_events(pid: int) -> str:
    """The sibling's cgroup v2 ``cgroup.events`` text ("" when not found)."""
    mounts = [
        line.split()[4]
        for line in Path("/proc/self/mountinfo").read_text().splitlines()
        if " - cgroup2 " in line
    ]
    rel = ""
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        if line.startswith("0::"):
            rel = line[3:]
    for mount in mounts:
        events = Path(mount + rel) / "cgroup.events"
        if events.is_file():
            return events.read_text()
    return ""


def main() -> int:
    """Run the region and write what was seen as JSON."""
    sib, out = Path(sys.argv[1]), Path(sys.argv[2])
    deadline = time.monotonic() + 30
    while True:
        try:
            pid, first = sample(sib)
            time.sleep(0.1)
            if sample(sib)[1] > first:
                break
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise SystemExit("sibling never started")
        time.sleep(0.05)
    before = sample(sib)[1]
    with region.critical():
        at_entry = sample(sib)[1]
        time.sleep(1.0)
        at_end = sample(sib)[1]
        events = cgroup_events(pid)
    time.sleep(0.5)
    after = sample(sib)[1]
    out.write_text(
        json.dumps(
            {
                "sibling_pid": pid,
                "before": before,
                "at_entry": at_entry,
                "at_end": at_end,
                "after": after,
                "cgroup_events_in_region": events,
                "stats": region.stats(),
            }
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
