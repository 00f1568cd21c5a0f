"""cuGetProcAddress resolves like the real driver, the exports are exactly
what it can reach, and the error-name table matches cuda.h."""

from __future__ import annotations

import ctypes
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .harness import HERE, Build

CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_NOT_FOUND = 500
CUDA_ERROR_NOT_SUPPORTED = 801
LEGACY, PER_THREAD = 1, 2
SUCCESS, SYMBOL_NOT_FOUND, VERSION_NOT_SUFFICIENT = 0, 1, 2
# Columns of the measured table, after the base name.
COLUMNS = [
    (12000, LEGACY),
    (12000, PER_THREAD),
    (13000, LEGACY),
    (13000, PER_THREAD),
    (11000, LEGACY),
]
# Versions at which rows of the table start (cudaTypedefs.h), to reach every row.
VERSIONS = [
    int(v)
    for v in (
        "3000 3020 4000 6000 7000 9020 10000 10010 11000 11020 11030 11040 11060"
        " 12000 12050 12080 13000"
    ).split()
]


class Lib:
    """The fake driver loaded by path into the test process (no cuInit needed here)."""

    def __init__(self, path: Path) -> None:
        self.dll = ctypes.CDLL(str(path))
        self.gpa = self.dll.cuGetProcAddress_v2
        self.gpa.restype = ctypes.c_int
        self.gpa.argtypes = [
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
            ctypes.c_int,
            ctypes.c_uint64,
            ctypes.POINTER(ctypes.c_int),
        ]
        out = subprocess.run(
            ["nm", "-D", "--defined-only", str(path)], capture_output=True, text=True, check=True
        ).stdout
        self.exports = {line.split()[-1] for line in out.splitlines() if " T " in line}
        self.by_addr = {self.addr(name): name for name in self.exports}

    def addr(self, name: str) -> int:
        value = ctypes.cast(getattr(self.dll, name), ctypes.c_void_p).value
        assert value is not None
        return value

    def resolve(self, base: str, version: int, flags: int) -> tuple[int, str | None, int]:
        """(CUresult, exported name the pointer belongs to or None, symbol status)."""
        pfn, status = ctypes.c_void_p(), ctypes.c_int(-1)
        rc = self.gpa(base.encode(), ctypes.byref(pfn), version, flags, ctypes.byref(status))
        return rc, self.by_addr.get(pfn.value) if pfn.value else None, status.value


@pytest.fixture(scope="module")
def lib(fakecuda_build: Build) -> Lib:
    return Lib(fakecuda_build.lib_dir / "libcuda.so.1")


def measured() -> list[list[str]]:
    rows = (HERE / "procaddr-580.159.04.tsv").read_text().splitlines()
    return [r.split("\t") for r in rows if r and not r.startswith("#")]


def test_resolutions_match_the_real_driver(lib: Lib) -> None:
    rows = measured()
    assert len(rows) >= 60
    mismatches = []
    for base, *expected in rows:
        for (version, flags), want in zip(COLUMNS, expected, strict=True):
            rc, got, status = lib.resolve(base, version, flags)
            if (got or "NULL") != want:
                mismatches.append(f"{base}@{version}/{flags}: {got} != {want}")
            assert (rc == 0) == (want != "NULL") and (status == SUCCESS) == (want != "NULL")
            if want == "NULL":
                assert (rc, status) == (CUDA_ERROR_NOT_FOUND, VERSION_NOT_SUFFICIENT)
    assert not mismatches


def test_exports_are_exactly_what_procaddress_reaches(lib: Lib) -> None:
    reached: set[str] = set()
    bases = {re.sub(r"(_v\d+)?(_ptsz|_ptds)?$", "", name) for name in lib.exports}
    for base in bases:
        for version in VERSIONS:
            for flags in (LEGACY, PER_THREAD):
                rc, name, _ = lib.resolve(base, version, flags)
                if rc == 0:
                    assert name is not None, f"{base}@{version} resolved to a non-export"
                    reached.add(name)
    assert reached == lib.exports


def test_failed_lookups(lib: Lib) -> None:
    assert lib.resolve("cuNoSuchFunction", 13000, LEGACY) == (
        CUDA_ERROR_NOT_FOUND,
        None,
        SYMBOL_NOT_FOUND,
    )
    assert lib.resolve("cuMemAlloc_v2", 13000, LEGACY)[0] == CUDA_ERROR_NOT_FOUND  # base names only
    assert lib.resolve("cuLaunchKernelEx", 11000, LEGACY) == (
        CUDA_ERROR_NOT_FOUND,
        None,
        VERSION_NOT_SUFFICIENT,
    )
    assert lib.resolve("cuInit", 14000, LEGACY)[0] == CUDA_ERROR_INVALID_VALUE  # newer than driver


def test_four_argument_self_lookup(lib: Lib) -> None:
    gpa4 = lib.dll.cuGetProcAddress
    gpa4.restype = ctypes.c_int
    gpa4.argtypes = [
        ctypes.c_char_p,
        ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int,
        ctypes.c_uint64,
    ]
    for version, want in ((12000, "cuGetProcAddress_v2"), (11030, "cuGetProcAddress")):
        pfn = ctypes.c_void_p()
        assert gpa4(b"cuGetProcAddress", ctypes.byref(pfn), version, LEGACY) == 0
        assert lib.by_addr[pfn.value or 0] == want
    pfn = ctypes.c_void_p()
    assert gpa4(b"cuGetProcAddress", ctypes.byref(pfn), 11000, LEGACY) == CUDA_ERROR_NOT_FOUND
    assert pfn.value is None


def test_export_table_is_not_supported(lib: Lib) -> None:
    table = ctypes.c_void_p(1)
    uuid = (ctypes.c_char * 16)()
    assert lib.dll.cuGetExportTable(ctypes.byref(table), uuid) == CUDA_ERROR_NOT_SUPPORTED
    assert table.value is None


def test_error_table_is_generated_from_cuda_h(lib: Lib) -> None:
    include = os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")
    check = subprocess.run(
        [
            sys.executable,
            str(HERE / "tools" / "gen_errors.py"),
            "--check",
            "--cuda-include",
            include,
        ],
        capture_output=True,
        text=True,
    )
    assert check.returncode == 0, check.stderr
    enum = re.search(
        r"typedef enum cudaError_enum \{(.*?)\} CUresult;",
        (Path(include) / "cuda.h").read_text(),
        re.S,
    )
    assert enum is not None
    constants = re.findall(r"^\s*(CUDA_[A-Z0-9_]+)\s*=\s*(\d+)", enum.group(1), re.M)
    assert len(constants) > 90
    name, text = ctypes.c_char_p(), ctypes.c_char_p()
    for const, value in constants:
        assert lib.dll.cuGetErrorName(int(value), ctypes.byref(name)) == 0
        assert name.value == const.encode()
        assert lib.dll.cuGetErrorString(int(value), ctypes.byref(text)) == 0 and text.value
    lib.dll.cuGetErrorString(2, ctypes.byref(text))
    assert text.value == b"out of memory"
    assert lib.dll.cuGetErrorName(123456, ctypes.byref(name)) == CUDA_ERROR_INVALID_VALUE
    assert name.value is None


def test_checkpoint_calls_resolve_from_their_cuda_version(lib: Lib) -> None:
    """cudaTypedefs.h declares them as PFN_cuCheckpointProcess*_v12080."""
    for base in (
        "cuCheckpointProcessLock",
        "cuCheckpointProcessUnlock",
        "cuCheckpointProcessGetState",
    ):
        assert lib.resolve(base, 12080, LEGACY) == (0, base, SUCCESS)
        assert lib.resolve(base, 13000, PER_THREAD) == (0, base, SUCCESS)
        assert lib.resolve(base, 12000, LEGACY) == (
            CUDA_ERROR_NOT_FOUND,
            None,
            VERSION_NOT_SUFFICIENT,
        )


def test_every_export_is_an_export_of_the_real_driver(lib: Lib) -> None:
    real = HERE.parent / "shim" / "data" / "libcuda-580.159.04-exports.txt"
    names = {ln.strip() for ln in real.read_text().splitlines() if ln and not ln.startswith("#")}
    assert lib.exports - names == set()
