"""Loading the driver past the hooks (docs/design/shim.md "Loading the driver past the hooks").

``dl_open`` (tests/shim/c/dl_open.c) loads libraries through the shim's
``dlopen``/``dlmopen`` entries, from the program or from ``libdlo_caller.so``,
whose RUNPATH ``$ORIGIN/dlo`` is the only place the libraries are found:

* under krex, ``RTLD_DEEPBIND`` of the driver, or of a library that needs it
  (``libdlo_user.so``, DT_NEEDED libcuda.so.1), and ``dlmopen`` of either into
  a new namespace are refused: NULL, a ``dlerror()`` that says so, one line on
  stderr.  Without the refusal ``dlo_user()``'s cuInit reaches the driver
  without the shim;
* plain loads of the driver, ``RTLD_DEEPBIND`` of unrelated libraries and
  ``dlmopen`` of them keep working, and names are still found through the
  *caller's* RUNPATH (the entries keep the caller's return address), with
  the loaded library's own ``$ORIGIN`` dependencies;
* a pass-through process (not under krex) is not refused anything.

The same holds for the HIP runtime (``libamdhip64.so.6``, the fake one of
tests/fakehip, and ``libdlo_hipuser.so``, DT_NEEDED libamdhip64.so.6): loaded
past the hooks, ``dlo_user()``'s hipInit would initialize the runtime and its
later calls run ungated.
"""

from __future__ import annotations

import json
import subprocess
from typing import Any

import pytest

from krexd.gate import Gate
from tests.fakecuda.harness import FakeCuda
from tests.fakehip.harness import FakeHip
from tests.support import ShimBuild, tenant_env

REFUSED_LINE = "its GPU calls would bypass krex's gate"


def dl_open(build: ShimBuild, env: dict[str, str], *args: str) -> tuple[dict[str, Any], str]:
    out = subprocess.run(
        [str(build.prog("dl_open")), *args], env=env, capture_output=True, text=True, timeout=10
    )
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout), out.stderr


@pytest.fixture
def krex_env(shim_build: ShimBuild, fc: FakeCuda, gate: Gate) -> dict[str, str]:
    return fc.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2))


REFUSED = [
    ("main", "libcuda.so.1", "deepbind"),
    ("caller", "libdlo_user.so", "deepbind"),  # found through the caller's RUNPATH
    ("mmain", "libcuda.so.1"),
    ("mcaller", "libdlo_user.so"),
]


@pytest.mark.parametrize("args", REFUSED, ids=["-".join(a) for a in REFUSED])
def test_a_load_that_binds_the_driver_past_the_hooks_is_refused(
    shim_build: ShimBuild, fc: FakeCuda, krex_env: dict[str, str], args: tuple[str, ...]
) -> None:
    bare, _ = dl_open(shim_build, fc.env(), *args)
    assert bare["loaded"] == 1, bare  # the load itself works without the shim
    r, err = dl_open(shim_build, krex_env, *args)
    assert r["loaded"] == 0, f"loaded past the hooks: {r}"
    assert "krex refused" in r["error"], r
    lines = [line for line in err.splitlines() if line.startswith("krex: refused")]
    assert len(lines) == 1 and REFUSED_LINE in lines[0], err
    assert ("RTLD_DEEPBIND" in lines[0]) == ("deepbind" in args), lines


ALLOWED = [
    ("caller", "libdlo_plain.so"),  # caller's RUNPATH, then the library's own $ORIGIN
    ("caller", "libdlo_plain.so", "deepbind"),
    ("caller", "libdlo_user.so"),  # no DEEPBIND: its cu* names bind to the hooks
    ("main", "libcuda.so.1"),
    ("mcaller", "libdlo_plain.so"),
]


@pytest.mark.parametrize("args", ALLOWED, ids=["-".join(a) for a in ALLOWED])
def test_other_loads_keep_working(
    shim_build: ShimBuild, krex_env: dict[str, str], args: tuple[str, ...]
) -> None:
    r, err = dl_open(shim_build, krex_env, *args)
    assert r["loaded"] == 1, (r, err)
    assert "krex: refused" not in err
    if "plain" in args[1]:
        assert r["call"] == 8  # dlo_leaf() + 1: its dependency was found and bound
    if "user" in args[1]:
        assert r["call"] == 0  # cuInit through the hook, gated and admitted


def test_a_pass_through_process_is_not_refused(shim_build: ShimBuild, fc: FakeCuda) -> None:
    env = fc.env(LD_PRELOAD=str(shim_build.shim))  # no KREX_GATE: not under krex
    for args in REFUSED:
        r, err = dl_open(shim_build, env, *args)
        assert r["loaded"] == 1 and "krex: refused" not in err, (args, r, err)


# ---- the HIP runtime --------------------------------------------------------------------


@pytest.fixture
def hip_env(shim_build: ShimBuild, fh: FakeHip, gate: Gate) -> dict[str, str]:
    return fh.env(LD_PRELOAD=str(shim_build.shim), **tenant_env(gate, 2))


HIP_REFUSED = [
    ("main", "libamdhip64.so.6", "deepbind"),
    ("caller", "libdlo_hipuser.so", "deepbind"),
    ("mmain", "libamdhip64.so.6"),
    ("mcaller", "libdlo_hipuser.so"),
]


@pytest.mark.parametrize("args", HIP_REFUSED, ids=["-".join(a) for a in HIP_REFUSED])
def test_a_load_that_binds_the_hip_runtime_past_the_hooks_is_refused(
    shim_build: ShimBuild, fh: FakeHip, hip_env: dict[str, str], args: tuple[str, ...]
) -> None:
    bare, _ = dl_open(shim_build, fh.env(), *args)
    assert bare["loaded"] == 1, bare
    r, err = dl_open(shim_build, hip_env, *args)
    assert r["loaded"] == 0, f"loaded past the hooks: {r}"
    assert "krex refused" in r["error"], r
    lines = [line for line in err.splitlines() if line.startswith("krex: refused")]
    assert len(lines) == 1 and REFUSED_LINE in lines[0] and "HIP runtime" in lines[0], err
    assert ("RTLD_DEEPBIND" in lines[0]) == ("deepbind" in args), lines


HIP_ALLOWED = [
    ("caller", "libdlo_hipuser.so"),  # no DEEPBIND: its hip* names bind to the hooks
    ("main", "libamdhip64.so.6"),
]


@pytest.mark.parametrize("args", HIP_ALLOWED, ids=["-".join(a) for a in HIP_ALLOWED])
def test_plain_loads_of_the_hip_runtime_keep_working(
    shim_build: ShimBuild, gate: Gate, hip_env: dict[str, str], args: tuple[str, ...]
) -> None:
    r, err = dl_open(shim_build, hip_env, *args)
    assert r["loaded"] == 1, (r, err)
    assert "krex: refused" not in err
    if "hipuser" in args[1]:
        assert r["call"] == 0  # hipInit through the hook: gated, registered
        assert any(s.tenant == 2 for s in gate.registrations() if s.state != "free"), (
            gate.registrations()
        )


def test_a_pass_through_process_may_load_the_hip_runtime_anyhow(
    shim_build: ShimBuild, fh: FakeHip
) -> None:
    env = fh.env(LD_PRELOAD=str(shim_build.shim))
    for args in HIP_REFUSED:
        r, err = dl_open(shim_build, env, *args)
        assert r["loaded"] == 1 and "krex: refused" not in err, (args, r, err)
