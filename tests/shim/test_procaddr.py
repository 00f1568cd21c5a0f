"""cuGetProcAddress of names cuda.h does not declare (shim.md: "How calls reach the hooks").

``cu_procaddr`` (tests/shim/c/cu_procaddr.c) asks the resolvers through the
shim.  With ``KREX_FAKE_NEWER_DRIVER=1`` the fake driver resolves ``cuFooBar``
to an unexported function of its own, as a driver newer than the shim's
headers would.  Under krex that pointer is refused (CUDA_ERROR_NOT_FOUND,
symbolStatus SYMBOL_NOT_FOUND, no pointer, one stderr line); every name of
the real driver's resolution table (tests/fakecuda/procaddr-580.159.04.tsv)
still resolves as without the shim, to the hook when the export is hooked.
"""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from krexd.gate import Gate
from tests.fakecuda.harness import FakeCuda
from tests.support import ShimBuild, json_lines, tenant_env

from .test_generated import table_rows

TSV = Path(__file__).parents[1] / "fakecuda" / "procaddr-580.159.04.tsv"
NOT_FOUND = 500
SYMBOL_NOT_FOUND = 1


def lookups(
    build: ShimBuild, env: dict[str, str], lines: list[str]
) -> tuple[list[dict[str, Any]], str]:
    out = subprocess.run(
        [str(build.prog("cu_procaddr"))],
        input="".join(f"{ln}\n" for ln in lines),
        env=env,
        capture_output=True,
        text=True,
        timeout=20,
    )
    assert out.returncode == 0, out.stderr
    return json_lines(out.stdout), out.stderr


def test_an_unknown_name_is_refused_under_krex(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate
) -> None:
    asks = ["cuFooBar 12000 0", "cuFooBar 13000 1", "cuFooBar 12000 0 4"]
    bare, _ = lookups(shim_build, fc.env(KREX_FAKE_NEWER_DRIVER="1"), asks)
    assert all(r["rc"] == 0 and r["object"] == "libcuda.so.1" for r in bare), bare
    env = fc.env(LD_PRELOAD=str(shim_build.shim), KREX_FAKE_NEWER_DRIVER="1", **tenant_env(gate, 2))
    got, err = lookups(shim_build, env, asks)
    for r in got:
        assert r["rc"] == NOT_FOUND and r["null"] == 1, r  # no pointer into the driver
    assert [r["status"] for r in got] == [SYMBOL_NOT_FOUND, SYMBOL_NOT_FOUND, -1]
    said = [ln for ln in err.splitlines() if "cuFooBar" in ln]
    assert len(said) == 1 and "CUDA_ERROR_NOT_FOUND" in said[0], err
    # A pass-through process (not under krex) is not refused anything.
    passed, _ = lookups(
        shim_build, fc.env(LD_PRELOAD=str(shim_build.shim), KREX_FAKE_NEWER_DRIVER="1"), asks
    )
    assert all(r["rc"] == 0 and r["object"] == "libcuda.so.1" for r in passed), passed


def table_asks() -> list[str]:
    """Every (base, version, stream flavour) of the real driver's table, both resolvers."""
    rows = [ln.split("\t") for ln in TSV.read_text().splitlines() if ln and ln[0] != "#"]
    header = next(ln for ln in TSV.read_text().splitlines() if ln.startswith("# base")).split("\t")[
        1:
    ]
    cols = []
    for h in header:
        version, flavour = h.removeprefix("cudaVersion=").split(",")
        cols.append((int(version), 1 if flavour == "PER_THREAD" else 0))
    asks = [f"{row[0]} {v} {pt}" for row in rows for v, pt in cols]
    return asks + [f"{row[0]} 12000 0 4" for row in rows]


def test_every_table_name_still_resolves_to_its_hook(
    shim_build: ShimBuild, fc: FakeCuda, gate: Gate
) -> None:
    asks = table_asks()
    hooked = {n for n, (_, flags) in table_rows().items() if "HOOKED" in flags}
    bare, _ = lookups(shim_build, fc.env(), asks)
    env = fc.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2))
    got, err = lookups(shim_build, env, asks)
    assert len(got) == len(bare) == len(asks) > 300
    assert "CUDA_ERROR_NOT_FOUND" not in err, err
    seen_hooked = 0
    for b, s in zip(bare, got, strict=True):
        assert (s["rc"], s["status"], s["null"]) == (b["rc"], b["status"], b["null"]), (b, s)
        assert s["symbol"] == b["symbol"], (b, s)  # the driver's choice of export is kept
        if b["null"]:
            continue
        want = "libkrex_shim.so" if b["symbol"] in hooked else "libcuda.so.1"
        assert s["object"] == want, (b, s)
        seen_hooked += want == "libkrex_shim.so"
    assert seen_hooked > 100
