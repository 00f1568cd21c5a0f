#!/usr/bin/env python3
"""Generate libkrex_shim's HIP runtime entry points from the HIP headers.

Reads every ``hip*`` function the HIP headers declare (hip_decls.py: the C
API of ``hip_runtime.h``, ``hiprtc.h`` and ``amd_detail/hip_runtime_prof.h``,
plus what only C++ declares in ``hip_ext.h`` and ``hip_runtime_api.h``),
classifies each name with ``hip_classes.toml`` (classes A/B/C/D, the rules
of epclass.py, shared with the CUDA generator) and writes three files:

* ``hip_entrypoints.gen.h``: one enum constant per declared name (sorted by
  name), the table's type and flags (gated, launch, per-thread stream, C++
  linkage, hooked); per class an X-macro with each name's full prototype
  (``X(name, symbol, ret, params, args, flags)``); and the *ABI prototypes*
  of every name the shim hooks or calls itself: the same functions with
  each parameter reduced to a type of the same size and calling-convention
  class that needs no HIP header (pointers and handles ``void *``, enums and
  integers ``int32_t``-style, by-value structures the layouts of
  ``[abi.structs]``), as ``krex_hip_abi_<name>`` function types.  The
  reduction is found by compiling and running a probe against the headers.
* ``hip_hooks.gen.c``: built into the shim without any HIP header: the
  table (name, exported symbol, class, flags), the runtime versions the
  table accepts (``[runtime]``), and one exported hook per A or C name, per
  ``[gate_also]`` name and per observed name: ``bind -> gate enter ->
  observe -> real -> observe -> gate leave``, as for CUDA; and per other B
  or D name returning ``hipError_t`` a *forwarding* hook, ``bind -> real``: the
  process's first bind loads the runtime and initializes it under the gate
  (hipinterpose.c), whichever HIP call comes first.  A C++-linkage name gets
  a hook under its mangled symbol and one under its plain name.  The hook of
  an ``[oom_retry]`` name (every call that can fail because the device is
  full) repeats ``gate enter -> real -> gate leave`` while
  ``krex_hip_oom_retry()`` (memory.c) asks to, as CUDA's hooks do: a name
  that may need device memory (:func:`may_need_memory`) must be under
  ``[oom_retry]`` or ``[oom_reviewed]``.
* ``hip_entrypoints.gen.c``: compiled only against the headers (tests):
  compile-time checks that every C prototype of the table is the header's
  own and that every ABI prototype's parameters have the size and class of
  the header's types (and each ``[abi.structs]`` layout its offsets).

Usage: ``gen_hip_entrypoints.py [--hip-include DIR] [--classes FILE]
[--out-dir DIR] [--check]``; the include directory (``.../include/hip``)
defaults to ``$HIP_INCLUDE``, else ``/usr/include/hip`` if present, else
``/opt/rocm/include/hip``.  ``--check`` exits 1 when the files on disk
differ from what it would write.  Errors (an unclassified or doubly
classified name, a listed name the headers do not declare, a name that may
do device work reaching D without review, a name that may need device memory
neither retried nor reviewed, a hooked parameter type the ABI reduction does
not know) exit 2 with one line per problem.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM_DIR = HERE.parent
if str(HERE) not in sys.path:  # loaded by path (tests) as well as run as a script
    sys.path.insert(0, str(HERE))

from epclass import GenError, assign_classes, is_risky, names, write_outputs  # noqa: E402
from hip_decls import (  # noqa: E402
    C_HEADERS,
    DEFINES,
    Decl,
    default_include,
    hip_version,
    present,
    read_all,
)

SOURCE = "hip_classes.toml"
HEADER_NAME = "hip_entrypoints.gen.h"
SOURCE_NAME = "hip_entrypoints.gen.c"
HOOKS_NAME = "hip_hooks.gen.c"

# __builtin_classify_type values (gcc's typeclass.h).
_INTEGER, _ENUM, _BOOL, _POINTER, _REAL, _RECORD = 1, 3, 4, 5, 8, 12


@dataclass
class Entry:
    """One declared entry point, its class, its table flags and what its hook does."""

    decl: Decl
    cls: str = "?"
    launch: bool = False
    gated: bool = False
    called: bool = False  # the shim calls it itself (drains, the version check)
    pre: str | None = None
    post: str | None = None
    stream: str | None = None  # C expression of the call's stream, for capture checks
    forward: bool = False  # D, not otherwise hooked: bind (the gated initialization), call
    oom_bytes: str | None = None  # C expression of the device bytes requested ([oom_retry])
    flags: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        """The declared name."""
        return self.decl.name

    @property
    def hooked(self) -> bool:
        """True when the shim exports a hook of this name."""
        return (
            self.gated or self.pre is not None or self.post is not None or self.forward
            or self.oom_bytes is not None
        )  # fmt: skip

    @property
    def abi(self) -> bool:
        """True when the ABI prototype is generated (hooked or called by the shim)."""
        return self.hooked or self.called


def takes_stream(d: Decl) -> bool:
    """True when one of the parameters is a ``hipStream_t``."""
    return any(_bare(p.type) == "hipStream_t" for p in d.params)


def _bare(type_text: str) -> str:
    return type_text.replace("const ", "").strip()


def _struct_name(type_text: str) -> str:
    """A by-value structure's name as [abi.structs] lists it (``struct hipExtent``:
    ``hipExtent``)."""
    return _bare(type_text).removeprefix("struct ").strip()


def _section(rules: dict[str, object], name: str) -> dict[str, object]:
    table = rules.get(name, {})
    if not isinstance(table, dict):
        raise GenError(f"{SOURCE}: [{name}] must be a table")
    return table


def classify(decls: dict[str, Decl], rules: dict[str, object]) -> dict[str, Entry]:
    """An Entry per declared name, with its class, flags and hook behaviour.

    Raises GenError listing every problem: those of epclass.assign_classes,
    a ``[launch]`` name that is not a declared class-A name, an
    ``[undeclared]`` name that the headers do declare, a ``[gate_also]``,
    ``[observe.*]`` or ``[calls]`` name that they do not, and an
    ``[oom_retry]`` name that is not a declared name returning ``hipError_t``.
    """
    risky = {n: is_risky(n, takes_stream(d)) for n, d in decls.items()}
    classes, problems = assign_classes(risky, rules, "the HIP headers", SOURCE)
    entries = {n: Entry(d, classes.get(n, "?")) for n, d in decls.items()}
    for n in names(_section(rules, "launch"), source=SOURCE):
        if n not in entries or entries[n].cls != "A":
            problems.append(f"{n}: in [launch] but not a declared class-A name")
        else:
            entries[n].launch = True
    symbols = {d.symbol for d in decls.values()}
    for n in names(_section(rules, "undeclared"), source=SOURCE):
        if n in entries or n in symbols:
            problems.append(f"{n}: in [undeclared] but declared")
    for sect in ("gate_also", "calls"):
        for n in names(_section(rules, sect), source=SOURCE):
            if n not in entries:
                problems.append(f"{n}: in [{sect}] but not declared")
            elif sect == "gate_also":
                entries[n].gated = True
            else:
                entries[n].called = True
    observe = _section(rules, "observe")
    for when in ("pre", "post"):
        table = observe.get(when, {})
        if not isinstance(table, dict):
            raise GenError(f"{SOURCE}: [observe.{when}] must be a table")
        for n, stmt in table.items():
            if n not in entries or not isinstance(stmt, str):
                problems.append(f"{n}: bad [observe.{when}] entry")
            else:
                setattr(entries[n], when, stmt)
    for n, expr in _section(rules, "oom_retry").items():
        if n not in entries or not isinstance(expr, str) or not expr.strip():
            problems.append(f"{n}: bad [oom_retry] entry")
        elif entries[n].decl.ret != "hipError_t":
            problems.append(f"{n}: in [oom_retry] but returns {entries[n].decl.ret}")
        else:
            entries[n].oom_bytes = expr
    if problems:
        raise GenError("\n".join(sorted(problems)))
    for e in entries.values():
        if e.cls in ("A", "C"):
            e.gated = True
        # Every HIP call initializes the runtime when it is the process's first:
        # a B or D name that returns hipError_t gets a forwarding hook, whose
        # first bind initializes the runtime under the gate.  The others (error
        # and API name strings, the channel-descriptor constructor, profiler
        # switches, hiprtc) do not start the runtime: docs/design/shim.md.
        e.forward = (
            e.cls in ("B", "D") and not e.hooked and e.decl.ret == "hipError_t"
            and not e.name.startswith("hiprtc")
        )  # fmt: skip
        if e.gated:
            e.stream = next((p.name for p in e.decl.params if _bare(p.type) == "hipStream_t"), None)
            e.flags.append("KREX_HIP_EPF_GATED")
        if e.launch:
            e.flags.append("KREX_HIP_EPF_LAUNCH")
        if e.name.endswith("_spt"):
            e.flags.append("KREX_HIP_EPF_SPT")
        if e.decl.cxx:
            e.flags.append("KREX_HIP_EPF_CXX")
        if e.hooked:
            e.flags.append("KREX_HIP_EPF_HOOKED")
    return entries


# ---- out-of-memory retries ------------------------------------------------------------

# Names that say the call allocates, creates, registers, loads, launches,
# instantiates, maps memory or retains: each may need device memory (outside
# the graph-node API, which only edits graphs).
MAY_NEED_MEMORY = re.compile(r"Malloc|Alloc|Create|Register|Load|Launch|Instantiate|MemMap|Retain")
# A documentation comment and the declaration it documents, in a raw header.
DOC_DECL = re.compile(
    r"/\*\*((?:(?!\*/).)*)\*/\s*(?:HIP_PUBLIC_API\s+)?(?:DEPRECATED\([^)]*\)\s*)?"
    r"hipError_t\s+(hip\w+)\s*\(",
    re.S,
)


def documented_oom(include: Path, headers: list[str]) -> set[str]:
    """Names whose documentation in ``headers`` (relative to ``include``) lists
    ``hipErrorOutOfMemory`` among their returns."""
    found: set[str] = set()
    for h in headers:
        text = (include / h).read_text()
        found |= {
            m.group(2) for m in DOC_DECL.finditer(text) if "hipErrorOutOfMemory" in m.group(1)
        }
    return found


def may_need_memory(name: str, documented: set[str]) -> bool:
    """True when the call may fail because the device is full: its name says it
    allocates, creates, registers, loads, launches, instantiates, maps memory or
    retains (graph-node API excepted), or the headers document ``hipErrorOutOfMemory`` for it.
    HIP documents that error for few calls, so the name decides as well."""
    return name in documented or (MAY_NEED_MEMORY.search(name) is not None and "Node" not in name)


def check_oom(entries: dict[str, Entry], rules: dict[str, object], documented: set[str]) -> None:
    """Every name that may need device memory is retried (``[oom_retry]``) or reviewed
    (``[oom_reviewed]``), never both; raise GenError listing the others."""
    reviewed = set(names(_section(rules, "oom_reviewed"), source=SOURCE))
    problems = [f"{n}: in [oom_reviewed] but not declared" for n in reviewed if n not in entries]
    for e in entries.values():
        if e.oom_bytes is not None and e.name in reviewed:
            problems.append(f"{e.name}: in both [oom_retry] and [oom_reviewed]")
        elif e.oom_bytes is None and e.name not in reviewed and may_need_memory(e.name, documented):
            problems.append(
                f"{e.name}: may fail with hipErrorOutOfMemory; list it under [oom_retry], "
                "or under [oom_reviewed] with the reason it is not retried"
            )
    if problems:
        raise GenError("\n".join(sorted(problems)))


# ---- the ABI reduction --------------------------------------------------------------


def _probe(include: Path, body: str) -> list[list[int]]:
    """Compile and run ``body`` (printf lines of numbers) against the headers; its rows."""
    headers = present(include, C_HEADERS)
    src = "".join(f"#include <hip/{h}>\n" for h in headers)
    src += "#include <stdio.h>\nint main(void)\n{\n" + body + "    return 0;\n}\n"
    with tempfile.TemporaryDirectory() as tmp:
        exe = Path(tmp) / "probe"
        cmd = ["gcc", "-w", *DEFINES, f"-I{include.parent}", "-x", "c", "-", "-o", str(exe)]
        out = subprocess.run(cmd, input=src, capture_output=True, text=True, check=False)
        if out.returncode != 0:
            raise GenError(f"compiling the ABI probe failed: {out.stderr.strip()}")
        run = subprocess.run([str(exe)], capture_output=True, text=True, check=False)
        if run.returncode != 0:
            raise GenError(f"the ABI probe failed (rc {run.returncode})")
    return [[int(x) for x in line.split()] for line in run.stdout.splitlines()]


def reduce_types(include: Path, types: list[str], structs: dict[str, list[str]]) -> dict[str, str]:
    """{header type text: a type of the same size and calling-convention class}.

    Pointers (handles, function pointers) become ``void *``, integers and
    enums the ``<stdint.h>`` type of their size and signedness, floating
    types ``float``/``double``, structures ``struct krex_hip_abi_<name>``
    of ``[abi.structs]``.  Raises GenError for anything else.
    """
    body = "".join(
        f'    printf("%d %d %zu\\n", {i}, __builtin_classify_type(*({t} *)0), sizeof({t}));\n'
        for i, t in enumerate(types)
    )
    kinds = {row[0]: (row[1], row[2]) for row in _probe(include, body)}
    ints = [i for i, (k, _) in kinds.items() if k in (_INTEGER, _ENUM, _BOOL)]
    body = "".join(
        f'    printf("%d %d\\n", {i}, (int)((({types[i]})-1) < ({types[i]})0));\n' for i in ints
    )
    signed = {row[0]: row[1] for row in _probe(include, body)} if ints else {}
    out: dict[str, str] = {}
    problems = []
    for i, t in enumerate(types):
        kind, size = kinds[i]
        if kind == _POINTER:
            out[t] = "void *"
        elif kind in (_INTEGER, _ENUM, _BOOL) and size in (1, 2, 4, 8):
            out[t] = f"{'' if signed[i] else 'u'}int{8 * size}_t"
        elif kind == _REAL and size in (4, 8):
            out[t] = "float" if size == 4 else "double"
        elif kind == _RECORD and _struct_name(t) in structs:
            out[t] = f"struct krex_hip_abi_{_struct_name(t)}"
        else:
            problems.append(
                f"{t}: a parameter type of a hooked or called name that the ABI reduction "
                f"does not know (class {kind}, {size} bytes): add it to [abi.structs]"
            )
    if problems:
        raise GenError("\n".join(problems))
    return out


@dataclass
class Abi:
    """The reduced prototypes: ``types`` maps each header type text to its ABI type."""

    types: dict[str, str]
    structs: dict[str, list[str]]
    compat_majors: list[int]
    known_exports: list[str]


def _abi_params(e: Entry, abi: Abi) -> str:
    return ", ".join(f"{abi.types[p.type]} {p.name}" for p in e.decl.params) or "void"


def _args(e: Entry) -> str:
    return ", ".join(p.name for p in e.decl.params)


def build_abi(include: Path, entries: list[Entry], rules: dict[str, object]) -> Abi:
    """The ABI reduction of every hooked or called entry, and the ``[runtime]`` lists."""
    abi_sect = _section(rules, "abi")
    structs_raw = abi_sect.get("structs", {})
    if not isinstance(structs_raw, dict):
        raise GenError(f"{SOURCE}: [abi.structs] must be a table")
    structs = {str(k): [str(f) for f in v] for k, v in structs_raw.items()}
    problems = []
    types: list[str] = []
    for e in entries:
        if not e.abi:
            continue
        if e.hooked and e.decl.ret != "hipError_t" and not e.decl.ret.endswith("*"):
            problems.append(f"{e.name}: hooked but returns {e.decl.ret}, not hipError_t")
        for t in [e.decl.ret, *(p.type for p in e.decl.params)]:
            if t not in types and t != "void":
                types.append(t)
    if problems:
        raise GenError("\n".join(problems))
    runtime = _section(rules, "runtime")
    majors = runtime.get("compatible_majors", [])
    known = names(runtime, source=SOURCE, key="known_exports")
    undeclared = names(_section(rules, "undeclared"), source=SOURCE)
    if not isinstance(majors, list) or not all(isinstance(m, int) for m in majors):
        raise GenError(f"{SOURCE}: [runtime] compatible_majors must be a list of integers")
    return Abi(
        reduce_types(include, types, structs),
        structs,
        sorted(set(majors)),
        sorted(set(known) | set(undeclared)),
    )


# ---- rendering ----------------------------------------------------------------------


def _banner(version: tuple[int, int, int], headers: list[str]) -> str:
    v = ".".join(str(x) for x in version)
    return (
        f"/* Generated by libkrex_shim/tools/gen_hip_entrypoints.py from the HIP {v} headers\n"
        f" * ({', '.join(headers)})\n"
        " * and tools/hip_classes.toml.  Do not edit; re-run the generator. */\n"
    )


def _xmacro_row(e: Entry) -> str:
    d = e.decl
    params = ", ".join(f"{p.type} {p.name}" for p in d.params) or "void"
    args = ", ".join(p.name for p in d.params)
    flags = " | ".join(e.flags) or "0"
    return f'    X({d.name}, "{d.symbol}", {d.ret}, ({params}), ({args}), {flags})'


def render_header(
    entries: list[Entry], version: tuple[int, int, int], headers: list[str], abi: Abi
) -> str:
    """hip_entrypoints.gen.h: ids, flags, the table's type, the X-macros, the ABI types."""
    out = [_banner(version, headers)]
    out.append("#ifndef KREX_HIP_ENTRYPOINTS_GEN_H\n#define KREX_HIP_ENTRYPOINTS_GEN_H\n\n")
    out.append("#include <stddef.h>\n#include <stdint.h>\n\n")
    for part, value in zip(("MAJOR", "MINOR", "PATCH"), version, strict=True):
        out.append(f"#define KREX_HIP_EP_VERSION_{part} {value}\n")
    out.append("\nenum krex_hip_ep {\n")
    for i, e in enumerate(entries):
        out.append(f"    KREX_HIP_EP_{e.name} = {i},\n")
    out.append(f"    KREX_HIP_EP_COUNT = {len(entries)}\n}};\n\n")
    out.append("#define KREX_HIP_EPF_GATED 0x1u  /* A, C and [gate_also]: counted and gated */\n")
    out.append("#define KREX_HIP_EPF_LAUNCH 0x2u /* counted as a kernel launch */\n")
    out.append("#define KREX_HIP_EPF_SPT 0x4u    /* _spt: stream 0 is the per-thread stream */\n")
    out.append("#define KREX_HIP_EPF_CXX 0x8u    /* C++ linkage: exported mangled */\n")
    out.append("#define KREX_HIP_EPF_HOOKED 0x10u /* the shim exports a hook of this name */\n\n")
    out.append(
        "struct krex_hip_ep_desc {\n    const char *name;\n"
        "    const char *symbol; /* exported symbol: the name, or its C++ mangling */\n"
        "    char cls;           /* 'A'..'D' */\n    uint8_t flags;\n};\n\n"
    )
    out.append("/* Sorted by name (strcmp order); hip_hooks.gen.c. */\n")
    out.append("extern const struct krex_hip_ep_desc krex_hip_ep_desc[KREX_HIP_EP_COUNT];\n")
    out.append(
        "/* The hook exported under the name (NULL: unhooked), and for a C++-linkage\n"
        " * name the one exported under its mangled symbol (else NULL). */\n"
    )
    out.append("extern void *const krex_hip_ep_hook[KREX_HIP_EP_COUNT];\n")
    out.append("extern void *const krex_hip_ep_symhook[KREX_HIP_EP_COUNT];\n")
    out.append(
        "/* The runtime majors the table accepts besides its own ([runtime]\n"
        " * compatible_majors), and the exported names it knows beyond its rows\n"
        " * ([runtime] known_exports and [undeclared]; sorted). */\n"
    )
    out.append(f"#define KREX_HIP_COMPAT_MAJORS_N {len(abi.compat_majors)}\n")
    out.append(f"#define KREX_HIP_KNOWN_EXPORTS_N {len(abi.known_exports)}\n")
    out.append("extern const int krex_hip_compat_majors[];\n")
    out.append("extern const char *const krex_hip_known_exports[];\n\n")
    out.append(
        "/* Prototypes by class, as X(name, symbol, ret, params, args, flags):\n"
        " * params is the parenthesized parameter list with its names (C++ default\n"
        " * arguments dropped), args the parenthesized names.  The types are those\n"
        " * of <hip/hip_runtime.h> (and hiprtc.h, amd_detail/hip_runtime_prof.h)\n"
        " * compiled as C with __HIP_PLATFORM_AMD__; a KREX_HIP_EPF_CXX name is\n"
        " * reached from C through its symbol (an asm label). */\n"
    )
    for cls in "ABCD":
        rows = [_xmacro_row(e) for e in entries if e.cls == cls]
        out.append(f"#define KREX_HIP_EPS_{cls}(X) \\\n")
        out.append(" \\\n".join(rows))
        out.append("\n\n")
    out.append(
        "/* The ABI prototypes of the names the shim hooks or calls: the header's\n"
        " * types reduced to types of the same size and calling-convention class\n"
        " * (hip_entrypoints.gen.c checks them against the headers), so that the\n"
        " * shim builds without HIP's headers. */\n"
    )
    for name, fields in sorted(abi.structs.items()):
        body = " ".join(f"{f};" for f in fields)
        out.append(f"struct krex_hip_abi_{name} {{ {body} }};\n")
    out.append("\n")
    for e in entries:
        if e.abi:
            ret = abi.types[e.decl.ret] if e.decl.ret != "void" else "void"
            out.append(f"typedef {ret} krex_hip_abi_{e.name}({_abi_params(e, abi)});\n")
    out.append("\n#endif /* KREX_HIP_ENTRYPOINTS_GEN_H */\n")
    return "".join(out)


def render_source(
    entries: list[Entry],
    version: tuple[int, int, int],
    headers: list[str],
    includes: list[str],
    abi: Abi,
) -> str:
    """hip_entrypoints.gen.c: checks that each prototype is the header's, and each ABI type
    the header type's size and class.

    ``includes``: the headers read as C (hip_decls.C_HEADERS, those present).
    """
    out = [_banner(version, headers)]
    out.append("#ifndef __HIP_PLATFORM_AMD__\n#define __HIP_PLATFORM_AMD__\n#endif\n")
    out.extend(f"#include <hip/{h}>\n" for h in includes)
    out.append(f'#include <stddef.h>\n\n#include "{HEADER_NAME}"\n\n')
    out.append(
        "#if HIP_VERSION_MAJOR != KREX_HIP_EP_VERSION_MAJOR || "
        "HIP_VERSION_MINOR != KREX_HIP_EP_VERSION_MINOR || \\\n"
        "    HIP_VERSION_PATCH != KREX_HIP_EP_VERSION_PATCH\n"
        f'#error "{SOURCE_NAME} was generated from other HIP headers: '
        'run tools/gen_hip_entrypoints.py"\n#endif\n\n'
    )
    out.append(
        "/* A function type per row, from the X-macros; each C-linkage one must be\n"
        " * the type the headers declare.  The C++-linkage ones are declared under\n"
        " * their symbols, as a wrapper would reach them. */\n"
        "#define KREX_HIP_EP_TYPEDEF(name, symbol, ret, params, args, flags) "
        "typedef ret krex_hip_fn_##name params;\n"
    )
    for cls in "ABCD":
        out.append(f"KREX_HIP_EPS_{cls}(KREX_HIP_EP_TYPEDEF)\n")
    out.append(
        "\n#pragma GCC diagnostic push\n"
        '#pragma GCC diagnostic ignored "-Wdeprecated-declarations"\n'
    )
    for e in entries:
        if e.decl.cxx:
            out.append(
                f'extern krex_hip_fn_{e.name} krex_hip_cxx_{e.name} __asm__("{e.decl.symbol}");\n'
            )
        else:
            out.append(
                f"_Static_assert(__builtin_types_compatible_p(__typeof__({e.name}), "
                f'krex_hip_fn_{e.name}), "{e.name}");\n'
            )
    out.append("#pragma GCC diagnostic pop\n\n")
    out.append(
        "/* The ABI types: each the size and calling-convention class (an enum\n"
        " * counts as an integer) of the header's type, each structure the\n"
        " * header's layout. */\n"
        "#define KREX_HIP_CLASS(t) \\\n"
        "    (__builtin_classify_type(*(t *)0) == 3 ? 1 : __builtin_classify_type(*(t *)0))\n"
        "#define KREX_HIP_SAME_ABI(a, b) \\\n"
        "    (sizeof(a) == sizeof(b) && _Alignof(a) == _Alignof(b) && "
        "KREX_HIP_CLASS(a) == KREX_HIP_CLASS(b))\n"
    )
    for name, fields in sorted(abi.structs.items()):
        out.append(
            f'_Static_assert(KREX_HIP_SAME_ABI({name}, struct krex_hip_abi_{name}), "{name}");\n'
        )
        for f in fields:
            fname = f.split()[-1].lstrip("*").split("[")[0]
            out.append(
                f"_Static_assert(offsetof({name}, {fname}) == "
                f'offsetof(struct krex_hip_abi_{name}, {fname}), "{name}.{fname}");\n'
            )
    for t, reduced in abi.types.items():
        out.append(f'_Static_assert(KREX_HIP_SAME_ABI({t}, {reduced}), "{t}");\n')
    return "".join(out)


def _fail(e: Entry, what: str) -> str:
    """The hook's return when the call cannot be made: the error code, or NULL for a
    pointer result (after the same log line)."""
    call = f"krex_hip_{what}(KREX_HIP_EP_{e.name})"
    return call if e.decl.ret == "hipError_t" else f"((void){call}, NULL)"


def _hook_lines(e: Entry, ret: str, indent: str) -> list[str]:
    """bind -> gate enter (or refuse) -> pre -> real -> post -> gate leave -> the exit
    handler, one statement per line; an ``[oom_retry]`` name repeats the attempt (enter
    to leave) while ``krex_hip_oom_retry()`` asks to, so a wait is outside the gate."""
    lines = [f"KREX_HIP_HOOK_BIND({e.name}, {_fail(e, 'unbound')});"]
    if e.forward:
        lines.append(f"return krex_real_fn({_args(e)});")
        return [f"{indent}{line}\n" for line in lines]
    retry = e.oom_bytes is not None
    attempt = []
    if e.gated:
        spt = 1 if e.name.endswith("_spt") else 0
        enter = f"krex_enter_hip_stream({e.stream}, {spt})" if e.stream else "krex_enter()"
        lines.append("krex_hip_thread_check();")
        attempt.append(f"struct krex_slot *krex_s = {enter};")
        attempt.append(f"if (KREX_UNLIKELY(krex_s == KREX_REFUSED)) return {_fail(e, 'refused')};")
    if e.launch:
        attempt.append("krex_count_launch();")
    if e.pre:
        attempt.append(e.pre)
    attempt.append(f"{'' if retry else ret + ' '}krex_r = krex_real_fn({_args(e)});")
    if e.post:
        attempt.append(e.post)
    if e.gated:
        attempt.append("krex_leave(krex_s);")
    out = [f"{indent}{line}\n" for line in lines]
    if retry:
        out.append(f"{indent}struct krex_oom krex_o = KREX_OOM_INIT;\n{indent}{ret} krex_r;\n")
        out.append(f"{indent}do {{\n")
        out += [f"{indent}    {line}\n" for line in attempt]
        out.append(
            f"{indent}}} while (KREX_UNLIKELY(krex_r == KREX_HIP_ERROR_OUT_OF_MEMORY || "
            "krex_o.waiting) &&\n"
            f"{indent}         krex_hip_oom_retry(&krex_o, krex_r, (uint64_t)({e.oom_bytes})));\n"
        )
    else:
        out += [f"{indent}{line}\n" for line in attempt]
    if e.gated and e.decl.ret == "hipError_t":
        out.append(f"{indent}krex_hip_after(krex_r);\n")
    out.append(f"{indent}return krex_r;\n")
    return out


def render_hook(e: Entry, abi: Abi) -> str:
    """The exported hook(s) of one entry: under its name, and for C++ linkage its symbol."""
    ret = abi.types[e.decl.ret]
    params = _abi_params(e, abi)
    body = [*_hook_lines(e, ret, "    "), "}\n\n"]
    out = [f"KREX_HOOK {ret} {e.name}({params})\n{{\n", *body]
    if e.decl.cxx:
        sym = f"krex_hip_sym_{e.name}"
        out.append(f'KREX_HOOK {ret} {sym}({params}) __asm__("{e.decl.symbol}");\n')
        out.append(f"KREX_HOOK {ret} {sym}({params})\n{{\n")
        out.extend(body)
    return "".join(out)


def render_hooks(
    entries: list[Entry], version: tuple[int, int, int], headers: list[str], abi: Abi
) -> str:
    """hip_hooks.gen.c: the table, the runtime lists and every hook (no HIP header needed)."""
    out = [_banner(version, headers)]
    # The hooks are the top layer (docs/design/shim.md "Layering"): each header they use.
    out.append('#include "base.h" /* KREX_HOOK */\n')
    out.append('#include "call.h" /* krex_enter, krex_leave: the per-call protocol */\n')
    out.append('#include "hipcall.h" /* KREX_HIP_HOOK_BIND: the gated first call */\n')
    out.append('#include "hipdrain.h" /* krex_hip_after: the exit handler */\n')
    out.append('#include "hipinterpose.h" /* the table */\n')
    out.append('#include "hiptrack.h" /* devices, streams, captures */\n')
    out.append('#include "memory.h" /* device memory, krex_hip_oom_retry */\n')
    out.append('#include "region.h" /* the L2 flush buffers */\n')
    out.append('#include "shim.h" /* krex_hip_refused */\n')
    out.append('#include "track.h" /* the capture lock */\n\n')
    out.append("const struct krex_hip_ep_desc krex_hip_ep_desc[KREX_HIP_EP_COUNT] = {\n")
    for e in entries:
        flags = " | ".join(e.flags) or "0"
        out.append(f'    {{"{e.name}", "{e.decl.symbol}", \'{e.cls}\', {flags}}},\n')
    out.append("};\n\n")
    majors = ", ".join(str(m) for m in abi.compat_majors) or "0"
    out.append(f"const int krex_hip_compat_majors[] = {{{majors}}};\n")
    out.append("const char *const krex_hip_known_exports[] = {\n")
    out.extend(f'    "{n}",\n' for n in abi.known_exports)
    out.append("};\n\n")
    for e in entries:
        if e.hooked:
            out.append(render_hook(e, abi))
    out.append("void *const krex_hip_ep_hook[KREX_HIP_EP_COUNT] = {\n")
    for e in entries:
        out.append(f"    (void *){e.name},\n" if e.hooked else "    NULL,\n")
    out.append("};\n\nvoid *const krex_hip_ep_symhook[KREX_HIP_EP_COUNT] = {\n")
    for e in entries:
        hooked_sym = e.hooked and e.decl.cxx
        out.append(f"    (void *)krex_hip_sym_{e.name},\n" if hooked_sym else "    NULL,\n")
    out.append("};\n")
    return "".join(out)


def generate(include: Path, classes: Path) -> dict[str, str]:
    """Return {file name: content} for the three generated files.

    Raises GenError (headers missing or not understood, classification
    incomplete, a type the ABI reduction does not know), OSError and
    tomllib.TOMLDecodeError.
    """
    version = hip_version(include)
    decls = read_all(include)
    with classes.open("rb") as f:
        rules = tomllib.load(f)
    entries = classify(decls, rules)
    headers = sorted({d.header for d in decls.values()})
    check_oom(entries, rules, documented_oom(include, headers))
    ordered = [entries[n] for n in sorted(entries)]
    abi = build_abi(include, ordered, rules)
    return {
        HEADER_NAME: render_header(ordered, version, headers, abi),
        SOURCE_NAME: render_source(ordered, version, headers, present(include, C_HEADERS), abi),
        HOOKS_NAME: render_hooks(ordered, version, headers, abi),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: write (or --check) the generated files; 0 ok, 1 stale, 2 error."""
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--hip-include", type=Path, default=None)
    ap.add_argument("--classes", type=Path, default=HERE / SOURCE)
    ap.add_argument("--out-dir", type=Path, default=SHIM_DIR / "tenant")
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ns = ap.parse_args(argv)
    include = ns.hip_include if ns.hip_include is not None else default_include()
    try:
        files = generate(include, ns.classes)
    except (GenError, tomllib.TOMLDecodeError, OSError) as exc:
        for line in str(exc).splitlines():
            print(f"gen_hip_entrypoints: {line}", file=sys.stderr)
        return 2
    return write_outputs(files, ns.out_dir, ns.check, "gen_hip_entrypoints")


if __name__ == "__main__":
    sys.exit(main())
