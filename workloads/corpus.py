"""The corpus' families and their task listings (read through ``<family>.py --list``)."""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
FAMILIES: tuple[str, ...] = (
    "gemm",
    "conv",
    "softmax",
    "norm",
    "reduce",
    "elementwise",
    "attention",
    "topk",
    "moe_align",
    "embedding",
    "scan",
)


def listing(family: str, python: str = sys.executable) -> dict[str, Any]:
    """``<family>.py --list`` parsed: {"family", "tasks": [{"task", "band", "candidates", ...}]}.

    Read once per (family, python) and process (a script's listing does not
    change while it runs): a caller must not modify the document.

    Raises:
        RuntimeError: the script failed or printed something that is not the listing.
    """
    return _listing(family, python)


@functools.cache
def _listing(family: str, python: str) -> dict[str, Any]:
    script = HERE / f"{family}.py"
    out = subprocess.run(
        [python, str(script), "--list"], capture_output=True, text=True, timeout=60, check=False
    )
    if out.returncode != 0:
        raise RuntimeError(f"{script} --list failed ({out.returncode}): {out.stderr[-2000:]}")
    try:
        doc = json.loads(out.stdout)
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"{script} --list printed no JSON: {exc}") from None
    if not isinstance(doc, dict) or doc.get("family") != family:
        raise RuntimeError(f"{script} --list: unexpected document")
    return doc


def commands(python: str = sys.executable) -> list[dict[str, Any]]:
    """Every (family, task, candidate, band) of the corpus, in family order."""
    out = []
    for fam in FAMILIES:
        for t in listing(fam, python)["tasks"]:
            for cand in t["candidates"]:
                out.append({"family": fam, "task": t["task"], "candidate": cand, "band": t["band"]})
    return out
