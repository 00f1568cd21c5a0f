"""The GPU table of ``krexctl status`` and the column layout every table of it uses.

CPU columns print core lists in cpuset syntax (``0-2,5``), with headers that
say so and a legend under the table, so a one-core list (``7``) does not
read as a count.
"""

from __future__ import annotations

from typing import Any


def table(rows: list[list[str]]) -> str:
    """``rows`` (the first one the header) as left-aligned columns two spaces apart."""
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def _region_cells(region: Any) -> list[str]:
    if not isinstance(region, dict):
        return ["-", "-"]
    counts = region.get("regions", {})
    entry = region.get("entry_ms", {})
    done = f"{counts.get('completed', 0)}/{counts.get('granted', 0)}"
    ended = [f"{counts[k]} {k}" for k in ("failed", "recovered") if counts.get(k)]
    if ended:
        done += f" ({', '.join(ended)})"
    lat = f"{entry.get('p50', 0):.2f}/{entry.get('p99', 0):.2f}" if entry.get("n") else "-"
    return [done, lat]


def _gate_cell(g: dict[str, Any]) -> str:
    """``open``, ``t<holder> e<epoch>`` while the gate word is closed, ``-`` without a gate."""
    if not g.get("gate"):
        return "-"
    word = g.get("gate_word")
    if not isinstance(word, dict):
        return "open"
    return f"t{word.get('holder')} e{word.get('epoch')}"


def _gib(n: Any) -> str:
    return "-" if n is None else f"{int(n) / (1 << 30):.1f}"


def _memory_cell(mem: Any) -> str:
    """``used/total GiB (avail A)``, ``!`` while an allocation waits for co-tenants."""
    if not isinstance(mem, dict):
        return "-"
    cell = f"{_gib(mem.get('used_bytes'))}/{_gib(mem.get('total_bytes'))}"
    if mem.get("available_bytes") is not None:
        cell += f" (avail {_gib(mem['available_bytes'])})"
    if mem.get("waiting"):
        cell += " !oom-wait " + ",".join(f"t{t}" for t in mem["waiting"])
    return cell


_GPU_HEADER = [
    "GPU",
    "NAME",
    "VENDOR",
    "SLOTS",
    "SLICE CPUS",
    "RESERVED CPUS",
    "TENANT CPUS",
    "HOLDER",
    "GATE",
    "REGIONS",
    "ENTRY p50/p99 ms",
    "MEMORY GiB",
]

CPU_LEGEND = (
    "CPUS: cpuset lists (0-2,5 = CPUs 0, 1, 2 and 5): the GPU's slice; those reserved for "
    "a region holder's submitting thread; those its tenants run on (- none)"
)


def cpu_list(value: Any) -> str:
    """A core list in cpuset syntax (``"0-2,5"``), ``-`` when empty or absent.

    ``value``: krexd's string (already that syntax: normalized when it parses)
    or a list of core ids.
    """
    if isinstance(value, list | tuple):
        cores = {int(c) for c in value}
    elif isinstance(value, str) and value.strip():
        parsed = _parse_cpus(value)
        if parsed is None:
            return value
        cores = parsed
    else:
        return "-"
    return _format_cpus(cores) if cores else "-"


def _parse_cpus(text: str) -> set[int] | None:
    """``"0-2,5"`` -> {0, 1, 2, 5}; None when ``text`` is not a cpuset list."""
    cores: set[int] = set()
    try:
        for part in text.split(","):
            lo, _, hi = part.strip().partition("-")
            first, last = int(lo), int(hi or lo)
            if last < first:
                return None
            cores.update(range(first, last + 1))
    except ValueError:
        return None
    return cores


def _format_cpus(cores: set[int]) -> str:
    """{0, 1, 2, 5} -> ``"0-2,5"``."""
    ordered = sorted(cores)
    runs: list[str] = []
    start = prev = ordered[0]
    for c in [*ordered[1:], None]:
        if c is not None and c == prev + 1:
            prev = c
            continue
        runs.append(str(start) if start == prev else f"{start}-{prev}")
        if c is not None:
            start = prev = c
    return ",".join(runs)


def gpu_table(gpus: list[dict[str, Any]]) -> str:
    """One row per GPU of ``status``'s ``gpus``: vendor (only where a GPU is not NVIDIA's,
    so an NVIDIA host's table keeps its columns), slots, CPU lists, holder, gate word,
    regions, memory; then :data:`CPU_LEGEND`.  ``no GPUs`` when there are none."""
    vendors = any(g.get("vendor", "nvidia") != "nvidia" for g in gpus)
    rows = [[h for h in _GPU_HEADER if vendors or h != "VENDOR"]]
    for g in gpus:
        sl = g.get("slice") or {}
        holder = g.get("holder")
        slots = f"{g['slots_used']}/{g['slots_total']}" + (" excl" if g.get("exclusive") else "")
        rows.append(
            [
                str(g["index"]),
                g["name"],
                *([str(g.get("vendor") or "-")] if vendors else []),
                slots,
                cpu_list(sl.get("cores")) + (" (shared)" if sl.get("shared") else ""),
                cpu_list(sl.get("reserved")),
                cpu_list(sl.get("tenant_cores")),
                f"t{holder}" if holder is not None else "-",
                _gate_cell(g),
                *_region_cells(g.get("region")),
                _memory_cell(g.get("memory")),
            ]
        )
    return table(rows) + "\n" + CPU_LEGEND if len(rows) > 1 else "no GPUs"
