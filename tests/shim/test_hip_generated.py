"""The generated HIP entry-point table (libkrex_shim/tools/gen_hip_entrypoints.py).

* every hip function the HIP headers declare is classified (A/B/C/D), once;
* every declared name is exported by libamdhip64 5.2.21153 under its table
  symbol (mangled for C++ linkage), bar four HIP 5.2 declares but never
  built, and the exported-but-undeclared ones are exactly the [undeclared]
  list of hip_classes.toml;
* re-running the generator reproduces the committed files byte for byte (the
  header, the header checks, and the hooks built into the shim);
* every A and C name is hooked, and the hooked set is what the table's flags say;
* the generator refuses a classification that leaves out a launch or lets a
  stream-taking name reach D unreviewed;
* every ``[oom_retry]`` name's hook retries on hipErrorOutOfMemory through
  krex_hip_oom_retry with its byte count, and the generator refuses a name that
  may need device memory (by its name, or documented to return
  hipErrorOutOfMemory) left out of ``[oom_retry]`` and ``[oom_reviewed]``, and a
  name in both;
* the generated C compiles with -Wall -Wextra -Werror against the headers: each
  prototype is the header's, each ABI type (the hooks' parameter types, which need
  no HIP header) has the size, alignment and class of the header's;
* a hooked parameter type the ABI reduction does not know fails the generator.

The headers come from Debian's libamdhip64-dev (``packaging/install-build-deps.sh
--hip`` installs it, and under ``make test-packages`` the fixture runs it when they
are missing); the tests skip when the headers cannot be had, or are another HIP
version than the committed table's.
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
from typing import Any

import pytest

from tests.support import INSTALL_ENV, installs_allowed

from .procs import REPO

TOOLS = REPO / "libkrex_shim" / "tools"
GEN_H = REPO / "libkrex_shim" / "tenant" / "hip_entrypoints.gen.h"
GEN_C = REPO / "libkrex_shim" / "tenant" / "hip_entrypoints.gen.c"
GEN_HOOKS = REPO / "libkrex_shim" / "tenant" / "hip_hooks.gen.c"
EXPORTS = Path(__file__).parent / "data" / "libamdhip64-5.2.21153-exports.txt"
# Declared by the HIP 5.2 headers, absent from its library.
NOT_BUILT = {
    "hipLaunchHostFunc",
    "hipGraphKernelNodeGetAttribute",
    "hipGraphKernelNodeSetAttribute",
    "hipTexRefGetMipMappedArray",
}


def load_generator() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_hip_entrypoints", TOOLS / "gen_hip_entrypoints.py"
    )
    assert spec and spec.loader
    mod = importlib.util.module_from_spec(spec)
    sys.modules["gen_hip_entrypoints"] = mod
    spec.loader.exec_module(mod)
    return mod


# The fixture may install the headers with apt: make test-packages's lane (root, CI), never
# make test's or make check's, which must not change the host.
pytestmark = pytest.mark.packages


@pytest.fixture(scope="module")
def gen() -> ModuleType:
    return load_generator()


def committed_version() -> tuple[int, int, int]:
    """The HIP version the committed table was generated from."""
    found = re.findall(
        r"#define KREX_HIP_EP_VERSION_(?:MAJOR|MINOR|PATCH) (\d+)", GEN_H.read_text()
    )
    assert len(found) == 3
    return int(found[0]), int(found[1]), int(found[2])


@pytest.fixture(scope="module")
def hip_include(gen: ModuleType) -> Path:
    """The HIP include directory, installing Debian's headers when they are missing."""
    include: Path = gen.default_include()
    if not (include / "hip_runtime_api.h").is_file():
        if os.environ.get("HIP_INCLUDE"):
            pytest.skip(f"HIP headers not found in HIP_INCLUDE={include}")
        if not installs_allowed():
            pytest.skip(
                f"HIP headers not installed in {include}; make test-packages installs them "
                f"({INSTALL_ENV}=1: packaging/install-build-deps.sh --hip)"
            )
        res = subprocess.run(
            [str(REPO / "packaging" / "install-build-deps.sh"), "--hip"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            check=False,
        )
        include = gen.default_include()
        if not (include / "hip_runtime_api.h").is_file():
            pytest.skip(
                f"HIP headers not installed in {include} and install-build-deps.sh --hip "
                f"could not install them (rc={res.returncode}: {res.stderr.strip()})"
            )
    installed = gen.hip_version(include)
    if installed != committed_version():
        pytest.skip(
            f"installed HIP headers are {'.'.join(map(str, installed))}, the committed table "
            f"is from {'.'.join(map(str, committed_version()))}: regenerate it on purpose"
        )
    return include


@pytest.fixture(scope="module")
def declared(gen: ModuleType, hip_include: Path) -> dict[str, Any]:
    decls: dict[str, Any] = gen.read_all(hip_include)
    return decls


def rules() -> dict[str, Any]:
    return tomllib.loads((TOOLS / "hip_classes.toml").read_text())


def table_rows() -> dict[str, tuple[str, str, str]]:
    """name -> (symbol, class, flags) from the committed hip_hooks.gen.c."""
    return {
        m.group(1): (m.group(2), m.group(3), m.group(4))
        for m in re.finditer(r'\{"(\w+)", "(\w+)", \'([ABCD])\', ([^}]*)\}', GEN_HOOKS.read_text())
    }


def run_generator(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOLS / "gen_hip_entrypoints.py"), *args],
        capture_output=True,
        text=True,
        check=False,
    )


def generate_from(classes: str, hip_include: Path, out: Path) -> subprocess.CompletedProcess[str]:
    """Run the generator over the headers with ``classes`` as its table; output into ``out``."""
    (out / "hip_classes.toml").write_text(classes)
    return run_generator(
        "--hip-include", str(hip_include), "--classes", str(out / "hip_classes.toml"),
        "--out-dir", str(out),
    )  # fmt: skip


def test_every_declared_function_is_classified_once(
    gen: ModuleType, declared: dict[str, Any]
) -> None:
    r = rules()
    listed = [n for cls in "ABCD" for key in ("names", "reviewed") for n in r[cls].get(key, [])]
    assert len(listed) == len(set(listed)), "a name is listed twice"
    entries = gen.classify(declared, r)
    classes = {n: e.cls for n, e in entries.items()}
    assert set(classes.values()) == {"A", "B", "C", "D"}
    assert len(classes) >= 390
    rows = table_rows()
    assert set(rows) == set(classes)
    assert {n: c for n, (_, c, _) in rows.items()} == classes
    launches = {n for n, (_, _, flags) in rows.items() if "KREX_HIP_EPF_LAUNCH" in flags}
    assert launches == {
        "hipLaunchKernel",
        "hipLaunchKernel_spt",
        "hipModuleLaunchKernel",
        "hipExtModuleLaunchKernel",
        "hipHccModuleLaunchKernel",
        "hipExtLaunchKernel",
        "hipLaunchCooperativeKernel",
        "hipLaunchCooperativeKernel_spt",
        "hipLaunchCooperativeKernelMultiDevice",
        "hipExtLaunchMultiKernelMultiDevice",
        "hipLaunchByPtr",
        "hipGraphLaunch",
    }
    # The cases the classification must get right.
    for name in (
        "hipLaunchHostFunc",
        "hipStreamAddCallback",
        "hipMemcpy",
        "hipMemcpyAsync",
        "hipMemcpy_spt",
        "hipMemcpyToSymbol",
        "hipMemcpyToSymbolAsync",
        "hipMemsetD32Async",
        "hipMemPrefetchAsync",
        "hipStreamWaitValue32",
        "hipStreamWriteValue64",
        "hipEventRecord",
        "hipStreamWaitEvent",
        "hipFree",
        "hipMallocAsync",
    ):
        assert classes[name] == "A", name
    for name in (
        "hipDeviceSynchronize",
        "hipStreamSynchronize",
        "hipEventSynchronize",
        "hipStreamQuery",
        "hipEventQuery",
    ):
        assert classes[name] == "B", name
    for name in (
        "hipInit",
        "hipModuleLoadData",
        "hipModuleUnload",
        "hipCtxCreate",
        "hipDevicePrimaryCtxRetain",
        "hipDeviceReset",
        "hipGetSymbolAddress",
        "hipStreamCreate",  # a hardware queue: the GPU's run list is rebuilt
        "hipStreamDestroy",
        "hipGraphInstantiate",
    ):
        assert classes[name] == "C", name
    for name in ("hipSetDevice", "hipMalloc", "hipEventCreate", "hipGetDeviceCount"):
        assert classes[name] == "D", name
    # C++ linkage: the table carries the mangled symbol.
    sym, _, flags = rows["hipExtModuleLaunchKernel"]
    assert sym.startswith("_Z24hipExtModuleLaunchKernel") and "KREX_HIP_EPF_CXX" in flags


def test_declared_names_are_exported(declared: dict[str, Any]) -> None:
    exports = {ln.split("@")[0] for ln in EXPORTS.read_text().splitlines() if ln and ln[0] != "#"}
    assert len(exports) == 409
    symbols = {n: d.symbol for n, d in declared.items()}
    assert {n for n, s in symbols.items() if s not in exports} == NOT_BUILT
    undeclared = set(rules()["undeclared"]["names"])
    assert undeclared == exports - set(symbols.values())
    lib = Path("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.21153")
    if lib.is_file():  # the committed list is this library's
        out = subprocess.run(
            ["nm", "-D", "--defined-only", str(lib)], capture_output=True, text=True, check=True
        ).stdout
        live = {f.split()[2].split("@")[0] for f in out.splitlines() if f.split()[1] in "TWi"}
        assert live == exports


def test_generator_reproduces_committed_files(hip_include: Path) -> None:
    proc = run_generator("--hip-include", str(hip_include), "--check")
    assert proc.returncode == 0, proc.stderr


def test_generator_refuses_incomplete_classification(hip_include: Path, tmp_path: Path) -> None:
    text = (TOOLS / "hip_classes.toml").read_text()
    broken = (
        # A launch left out of every class (and of [launch]).
        text.replace('"hipLaunchKernel_spt", "hipModuleLaunchKernel",', '"hipLaunchKernel_spt",')
        # A stream-taking name reaching D through a pattern ...
        .replace('"hipStreamGetPriority",\n', "\n", 1)
        .replace('"hipArrayGet*", ', '"hipArrayGet*", "hipStreamGet*", ', 1)
        # ... and through a plain [D] name.
        .replace(' "hipStreamIsCapturing",\n', "\n", 1)
        .replace('"hipEventCreate", ', '"hipStreamIsCapturing", "hipEventCreate", ', 1)
    )
    assert broken.count('"hipModuleLaunchKernel"') == text.count('"hipModuleLaunchKernel"') - 2
    assert '"hipStreamGetPriority"' not in broken and '"hipStreamGet*"' in broken
    assert broken.count('"hipStreamIsCapturing"') == text.count('"hipStreamIsCapturing"')
    assert '"hipStreamIsCapturing", "hipEventCreate"' in broken
    proc = generate_from(broken, hip_include, tmp_path)
    assert proc.returncode == 2
    assert "hipModuleLaunchKernel: unclassified" in proc.stderr
    assert "hipStreamGetPriority: may do device work; classify it explicitly" in proc.stderr
    assert "hipStreamIsCapturing: may do device work; classify it in A/B/C" in proc.stderr
    assert not (tmp_path / "hip_entrypoints.gen.c").exists()


def test_every_gated_name_is_hooked() -> None:
    rows = table_rows()
    hooks = GEN_HOOKS.read_text()
    for name, (sym, cls, flags) in rows.items():
        hooked = "KREX_HIP_EPF_HOOKED" in flags
        if cls in "AC":
            assert hooked and "KREX_HIP_EPF_GATED" in flags, name
        assert (f" {name}(" in hooks) == hooked, name
        if hooked and "KREX_HIP_EPF_CXX" in flags:
            assert f'__asm__("{sym}")' in hooks, name
    # Observed or gated beyond their class.
    for name in ("hipStreamBeginCapture", "hipStreamEndCapture", "hipSetDevice"):
        assert "KREX_HIP_EPF_HOOKED" in rows[name][2], name
    assert "KREX_HIP_EPF_GATED" in rows["hipStreamBeginCapture"][2]


def test_oom_retry_hooks_retry() -> None:
    hooks = GEN_HOOKS.read_text()
    retried: dict[str, str] = rules()["oom_retry"]
    assert {"hipMalloc", "hipMallocAsync", "hipModuleLoadData", "hipModuleLaunchKernel"} <= set(
        retried
    )
    for name, expr in retried.items():
        body = re.search(rf"KREX_HOOK \w+ {name}\(.*?\n}}\n", hooks, re.S)
        assert body, name
        assert "krex_r == KREX_HIP_ERROR_OUT_OF_MEMORY || krex_o.waiting" in body.group(0), name
        assert f"krex_hip_oom_retry(&krex_o, krex_r, (uint64_t)({expr}))" in body.group(0), name
    # No other hook retries (a C++-linkage name has a second hook under its symbol).
    hooked_twice = [n for n in retried if f"krex_hip_sym_{n}(" in hooks]
    assert hooks.count("krex_hip_oom_retry(") == len(retried) + len(hooked_twice)


def test_generator_refuses_an_unreviewed_allocation(hip_include: Path, tmp_path: Path) -> None:
    text = (TOOLS / "hip_classes.toml").read_text()
    broken = (
        # An allocation left out (its name says it allocates) ...
        text.replace('hipMallocManaged = "size"\n', "", 1)
        # ... a name only its documentation marks (hipErrorOutOfMemory) ...
        .replace('"hipIpcGetMemHandle", ', "", 1)
        # ... and a name both retried and reviewed.
        .replace('"hiprtcCreateProgram",', '"hiprtcCreateProgram", "hipMalloc",', 1)
    )
    assert 'hipMallocManaged = "size"' not in broken and '"hipIpcGetMemHandle"' not in broken
    assert '"hiprtcCreateProgram", "hipMalloc",' in broken
    proc = generate_from(broken, hip_include, tmp_path)
    assert proc.returncode == 2
    assert "hipMallocManaged: may fail with hipErrorOutOfMemory" in proc.stderr
    assert "hipIpcGetMemHandle: may fail with hipErrorOutOfMemory" in proc.stderr
    assert "hipMalloc: in both [oom_retry] and [oom_reviewed]" in proc.stderr
    assert not (tmp_path / "hip_hooks.gen.c").exists()


def test_generator_refuses_an_unknown_by_value_type(hip_include: Path, tmp_path: Path) -> None:
    text = (TOOLS / "hip_classes.toml").read_text()
    broken = text.replace('dim3 = ["uint32_t x", "uint32_t y", "uint32_t z"]\n', "")
    assert broken != text
    proc = generate_from(broken, hip_include, tmp_path)
    assert proc.returncode == 2
    assert "dim3: a parameter type of a hooked or called name" in proc.stderr
    assert not (tmp_path / "hip_hooks.gen.c").exists()


def test_generated_c_compiles(hip_include: Path, tmp_path: Path) -> None:
    # The headers' own warnings are not the table's: -isystem (a no-op for /usr/include).
    proc = subprocess.run(
        [
            "cc",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-D__HIP_PLATFORM_AMD__",
            *(
                ["-isystem", str(hip_include.parent)]
                if hip_include.parent != Path("/usr/include")
                else []
            ),
            "-c",
            str(GEN_C),
            "-o",
            str(tmp_path / "hip_entrypoints.gen.o"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
