"""The generated entry-point table (libkrex_shim/tools/gen_entrypoints.py).

* every function cuda.h declares is classified (A/B/C/D), none twice;
* every export of the real driver 580.159.04 that cuda.h declares has a
  table row, and the exported-but-undeclared ones are exactly the
  [undeclared] list of classes.toml;
* libkrex_shim.so exports exactly the hooked names (all of A and C);
* re-running the generator reproduces the committed files byte for byte;
* the generator refuses a classification that leaves a name out.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from types import ModuleType

import pytest

from .procs import REPO, ShimBuild

TOOLS = REPO / "libkrex_shim" / "tools"
EXPORTS = Path(__file__).parent / "data" / "libcuda-580.159.04-exports.txt"
CUDA_INCLUDE = Path(os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include"))

pytestmark = pytest.mark.skipif(
    not (CUDA_INCLUDE / "cuda.h").is_file(), reason="cuda.h not installed"
)


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location("gen_entrypoints", TOOLS / "gen_entrypoints.py")
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_entrypoints"] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return load_generator()


@pytest.fixture(scope="module")
def declared(gen: ModuleType) -> dict[str, object]:
    text, _ = gen.preprocess(CUDA_INCLUDE)
    entries: dict[str, object] = gen.parse_declarations(text)
    return entries


def table_rows() -> dict[str, tuple[str, str]]:
    """name -> (class, flags) from the committed entrypoints.gen.c."""
    src = (REPO / "libkrex_shim" / "tenant" / "entrypoints.gen.c").read_text()
    return {
        m.group(1): (m.group(2), m.group(3))
        for m in re.finditer(r'\{"(cu\w+)", \'([ABCD])\', ([^}]*)\}', src)
    }


def exports() -> list[str]:
    return [ln.strip() for ln in EXPORTS.read_text().splitlines() if ln and ln[0] != "#"]


def test_every_declared_function_is_classified(
    gen: ModuleType, declared: dict[str, object]
) -> None:
    rules = tomllib.loads((TOOLS / "classes.toml").read_text())
    gen.classify(declared, rules)
    classes = {name: e.cls for name, e in declared.items()}  # type: ignore[attr-defined]
    assert set(classes.values()) == {"A", "B", "C", "D"}
    assert len(classes) > 600
    rows = table_rows()
    assert set(rows) == set(classes)
    assert {n: c for n, (c, _) in rows.items()} == classes
    # The cases the classification must get right.
    for name in (
        "cuMemFree_v2",
        "cuCtxSetLimit",
        "cuGraphInstantiateWithParams",
        "cuLaunchKernel_ptsz",
        "cuMemcpyHtoD_v2_ptds",
        "cuEventRecord",
    ):
        assert classes[name] == "A", name
    for name in ("cuCtxSynchronize_v2", "cuStreamSynchronize", "cuEventQuery"):
        assert classes[name] == "B", name
    for name in (
        "cuInit",
        "cuCtxCreate_v4",
        "cuDevicePrimaryCtxRetain",
        "cuModuleLoadData",
        "cuModuleGetGlobal_v2",
        "cuLibraryGetGlobal",
        "cuLibraryGetManaged",
    ):
        assert classes[name] == "C", name
    for name in ("cuCheckpointProcessCheckpoint", "cuCheckpointProcessRestore"):
        assert classes[name] == "A", name
    for name in ("cuMemAlloc_v2", "cuStreamCreate", "cuGetProcAddress_v2", "cuGetExportTable"):
        assert classes[name] == "D", name


def test_driver_exports_are_covered(declared: dict[str, object]) -> None:
    exp = exports()
    assert len(exp) == 682
    rows = table_rows()
    in_header = [n for n in exp if n in declared]
    assert in_header and all(n in rows for n in in_header)
    assert set(declared) <= set(exp), "cuda.h declares a name the driver does not export"
    rules = tomllib.loads((TOOLS / "classes.toml").read_text())
    undeclared = set(rules["undeclared"]["names"])
    assert undeclared == {n for n in exp if n not in declared}


def test_shim_exports_the_hooks(shim_build: ShimBuild) -> None:
    out = subprocess.run(
        ["nm", "-D", "--defined-only", str(shim_build.shim)],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    exported = {line.split()[-1] for line in out.splitlines() if " T " in line}
    rows = table_rows()
    hooked = {n for n, (_, flags) in rows.items() if "KREX_EPF_HOOKED" in flags}
    assert {n for n in exported if n.startswith("cu")} == hooked
    gated = {n for n, (c, _) in rows.items() if c in "AC"}
    assert gated <= hooked
    observed = {
        "cuGetProcAddress",
        "cuGetProcAddress_v2",
        "cuStreamCreate",
        "cuStreamDestroy_v2",
        "cuStreamBeginCapture_v2",
        "cuStreamEndCapture",
        "cuMemAlloc_v2",
        "cuEventRecord",
        "cuEventElapsedTime_v2",
    }
    assert observed <= hooked
    assert not {"cuCtxSynchronize", "cuStreamSynchronize", "cuGetExportTable"} & hooked
    assert {
        "dlsym",
        "dlopen",
        "dlmopen",
        "krex_shim_region_begin",
        "krex_shim_region_end",
        "krex_shim_region_other_streams_ns",
        "krex_shim_region_events_outside",
        "krex_shim_region_warm",
        "krex_shim_region_launches",
        "krex_shim_active",
        "krex_shim_mode",
    } <= exported
    assert not {n for n in exported if n.startswith("krex_gate_")}, "gate code leaks out"


def test_generator_reproduces_committed_files() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "gen_entrypoints.py"),
            "--cuda-include",
            str(CUDA_INCLUDE),
            "--check",
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr


def test_generator_refuses_incomplete_classification(tmp_path: Path) -> None:
    text = (TOOLS / "classes.toml").read_text()
    broken = (
        text.replace('"cuMemcpyAsync", ', "", 1)
        .replace('"cuStreamGetPriority", ', "", 1)
        .replace('"cuArray*", ', '"cuArray*", "cuStreamGet*", ', 1)
        # A plain [D] name that may do device work is refused as well.
        .replace(
            '"cuStreamIsCapturing", "cuStreamIsCapturing_ptsz",', '"cuStreamIsCapturing_ptsz",', 1
        )
        .replace(
            'names = [\n    "cuStreamCreate",',
            'names = [\n    "cuStreamIsCapturing", "cuStreamCreate",',
            1,
        )
    )
    assert '"cuStreamIsCapturing", "cuStreamCreate"' in broken
    assert broken.count("cuMemcpyAsync") < text.count("cuMemcpyAsync")
    assert "cuStreamGet*" in broken
    (tmp_path / "classes.toml").write_text(broken)
    proc = subprocess.run(
        [
            sys.executable,
            str(TOOLS / "gen_entrypoints.py"),
            "--cuda-include",
            str(CUDA_INCLUDE),
            "--classes",
            str(tmp_path / "classes.toml"),
            "--out-dir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 2
    assert "cuMemcpyAsync: unclassified" in proc.stderr
    # A stream-taking name may not reach D through a pattern.
    assert "cuStreamGetPriority: may do device work" in proc.stderr
    assert "cuStreamIsCapturing: may do device work; classify it in A/B/C" in proc.stderr
    assert not (tmp_path / "entrypoints.gen.c").exists()
