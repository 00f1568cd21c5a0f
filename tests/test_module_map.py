"""docs/design/architecture.md's module map names every module of the code.

One module map, kept complete: each Python module of ``krexd``, ``krex_cli``
and ``krex_client`` and each C source or header of ``libkrex_shim`` must be
named by its file name inside the map's entry of its folder (``x.c/.h``
names both), or by its path from the package (``cli/krexd.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = {
    "krexd/": ROOT / "krexd",
    "krex_cli/": ROOT / "krex_cli",
    "python_client/krex_client/": ROOT / "python_client" / "krex_client",
    "libkrex_shim/": ROOT / "libkrex_shim",
}
SUFFIXES = {".py", ".c", ".h", ".S"}


def map_lines() -> list[str]:
    """The lines of the code block under "Packages, one line per module"."""
    text = (ROOT / "docs" / "design" / "architecture.md").read_text(encoding="utf-8")
    section = text[text.index("## Packages, one line per module") :]
    start = section.index("```\n") + 4
    return section[start : section.index("\n```", start)].splitlines()


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


def entry(lines: list[str], folder: list[str]) -> str | None:
    """The text of ``folder``'s entry (its line and those indented under it), or None.

    ``folder``: the top package as the map names it, then subfolders.
    """
    lo, hi, depth = 0, len(lines), -1
    for name in folder:
        at = next(
            (
                i
                for i in range(lo, hi)
                if lines[i].strip()
                and _indent(lines[i]) > depth
                and lines[i].split()[0] in (name, name.rstrip("/") + "/")
            ),
            None,
        )
        if at is None:
            return None
        depth, lo = _indent(lines[at]), at
        end = at + 1
        while end < hi and (not lines[end].strip() or _indent(lines[end]) > depth):
            end += 1
        hi = end
    return "\n".join(lines[lo:hi])


def unnamed(lines: list[str]) -> list[str]:
    """The modules the map ``lines`` does not name (paths from the repository root)."""
    missing = []
    for top, base in PACKAGES.items():
        whole = entry(lines, [top]) or ""
        for path in sorted(base.rglob("*")):
            if path.suffix not in SUFFIXES or path.name in ("__init__.py", "__main__.py"):
                continue
            rel = path.relative_to(base)
            if "/" in str(rel) and str(rel) in whole:
                continue  # named by its path from the package (cli/krexd.py)
            folder = entry(lines, [top, *(p + "/" for p in rel.parts[:-1])])
            if folder is None or path.name not in named(folder):
                missing.append(str(path.relative_to(ROOT)))
    return missing


def named(text: str) -> set[str]:
    """The file names ``text`` names: ``x.py``, ``x.c``, ``x.c/.h`` (both), ``x.S``."""
    names = set()
    for stem, ext, also in re.findall(r"(?<![\w/.])([\w.]+?)\.(py|c|h|S)(/\.h)?(?![\w])", text):
        names.add(f"{stem}.{ext}")
        if also:
            names.add(f"{stem}.h")
    return names


def test_the_module_map_names_every_module() -> None:
    assert unnamed(map_lines()) == [], "add them to docs/design/architecture.md's module map"


def test_a_module_left_out_of_the_map_is_found() -> None:
    lines = map_lines()
    for gone, module in (
        ("    fifo.py ", "krexd/coordinator/fifo.py"),
        ("    request_queue.py ", "krexd/coordinator/request_queue.py"),
        ("    drain.c/.h ", "libkrex_shim/tenant/drain.c"),
    ):
        cut = [ln for ln in lines if not ln.startswith(gone)]
        assert len(cut) == len(lines) - 1, gone
        assert module in unnamed(cut)
    # A module named only in another folder's entry does not count: entry.py of the
    # coordinator is not krexd/entry.py.
    assert entry(lines, ["krexd/", "nowhere/"]) is None


#: Rooms whose unit tests live elsewhere: the gate's beside the shim's (one C
#: layout, tested from both sides); the ops' through a real krexd (tests/daemon);
#: krexd's command line in tests/cli with the other commands.
TESTED_ELSEWHERE = {"gate": "shim", "control": "daemon", "cli": "cli"}


def test_each_room_of_krexd_has_its_tests_folder() -> None:
    # The tests mirror the code: tests/<room>/ for each room of krexd (architecture.md).
    rooms = sorted(p.name for p in (ROOT / "krexd").iterdir() if (p / "__init__.py").exists())
    assert len(rooms) >= 10, rooms
    missing = [
        r
        for r in rooms
        if not (ROOT / "tests" / TESTED_ELSEWHERE.get(r, r) / "__init__.py").exists()
    ]
    assert missing == [], f"rooms with no tests/<room>/: {missing}"
    for room, where in TESTED_ELSEWHERE.items():
        assert room in rooms, f"{room} is no room of krexd any more: drop it from the exceptions"
        assert not (ROOT / "tests" / room / "__init__.py").exists() or room == where
