#!/usr/bin/env python3
"""Generate libkrex_shim's driver entry-point table from cuda.h.

Reads every function that ``cuda.h`` declares, preprocessed with
``-D__CUDA_API_VERSION_INTERNAL`` so that the legacy ABIs (``cuMemcpyHtoD``
with 32-bit sizes, ``cuCtxCreate`` v1-v3, ...) are declared beside the
current ones and the per-thread-stream macros turn the current names into
their ``_ptsz``/``_ptds`` exports.  Classifies each name with
``classes.toml`` (categories A/B/C/D; rules in docs/design/shim.md) and
writes ``entrypoints.gen.h`` and ``entrypoints.gen.c``:

* one enum constant and one table row per declared name (sorted by name),
  with its class and flags, for ``dlsym`` and ``cuGetProcAddress`` routing;
* one exported hook per A or C name, per name under ``[gate_also]`` and per
  observed name: ``gate enter -> real -> observe -> gate leave``; names under
  ``[oom_retry]`` (every call that can fail because the device is full; a
  name cuda.h documents as able to return ``CUDA_ERROR_OUT_OF_MEMORY`` must
  be there or under ``[oom_reviewed]``) repeat that while ``krex_oom_retry()``
  (memory.c) asks to, leaving the gate between attempts.

Usage: ``gen_entrypoints.py [--cuda-include DIR] [--out-dir DIR] [--check]``
(``--check`` exits 1 when the files on disk differ from what it would write).
Errors (an unclassified or doubly classified name, a listed name that
cuda.h does not declare) exit 2 with one line per problem.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
SHIM_DIR = HERE.parent
if str(HERE) not in sys.path:  # loaded by path (tests) as well as run as a script
    sys.path.insert(0, str(HERE))

from epclass import (  # noqa: E402
    PARAM_NAME,
    TYPE_WORDS,
    GenError,
    assign_classes,
    is_risky,
    write_outputs,
)
from epclass import names as _names  # noqa: E402

DECL = re.compile(r"\bCUresult\s+(cu[A-Za-z0-9_]+)\s*\(([^;{}]*?)\)\s*;", re.S)


@dataclass
class Param:
    """One parameter: its C type text and its name."""

    type: str
    name: str


@dataclass
class Entry:
    """One declared driver entry point and what its hook does."""

    name: str
    params: list[Param]
    cls: str = "?"
    gated: bool = False
    launch: bool = False
    stream: str | None = None  # C expression of the call's stream, for capture checks
    ptsz: bool = False  # per-thread default stream family (_ptsz/_ptds)
    pre: str | None = None
    post: str | None = None
    oom_bytes: str | None = None  # C expression of the device bytes requested ([oom_retry])
    hooked: bool = False
    flags: list[str] = field(default_factory=list)


def preprocess(cuda_include: Path) -> tuple[str, int]:
    """Run the C preprocessor over cuda.h; return (text without # lines, CUDA_VERSION)."""
    header = cuda_include / "cuda.h"
    if not header.is_file():
        raise GenError(f"cuda.h not found in {cuda_include} (set --cuda-include)")
    cmd = ["gcc", "-E", "-dD", "-D__CUDA_API_VERSION_INTERNAL", f"-I{cuda_include}", "-x", "c", "-"]
    out = subprocess.run(
        cmd, input="#include <cuda.h>\n", capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise GenError(f"preprocessing cuda.h failed: {out.stderr.strip()}")
    version = 0
    lines = []
    for line in out.stdout.splitlines():
        if line.startswith("#"):
            m = re.match(r"#define CUDA_VERSION (\d+)", line)
            if m:
                version = int(m.group(1))
            continue
        lines.append(line)
    if not version:
        raise GenError("CUDA_VERSION not defined by cuda.h")
    return "\n".join(lines), version


def parse_params(name: str, text: str) -> list[Param]:
    """Split a parameter list (no function-pointer or array parameters in cuda.h)."""
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    if "(" in text or "[" in text:
        raise GenError(f"{name}: unsupported parameter syntax: {text}")
    params = []
    for raw in text.split(","):
        raw = raw.strip()
        m = PARAM_NAME.match(raw)
        if not m or m.group("name") in TYPE_WORDS or not m.group("type").strip():
            raise GenError(f"{name}: parameter without a name: {raw!r}")
        params.append(Param(" ".join(m.group("type").split()).replace(" *", "*"), m.group("name")))
    return params


def parse_declarations(text: str) -> dict[str, Entry]:
    """Every `CUresult cuX(...)` declaration, by name."""
    entries: dict[str, Entry] = {}
    for m in DECL.finditer(text):
        name = m.group(1)
        if name in entries:
            raise GenError(f"{name}: declared twice")
        entries[name] = Entry(name, parse_params(name, m.group(2)))
    if not entries:
        raise GenError("no driver declarations found in cuda.h")
    return entries


def classify(entries: dict[str, Entry], rules: dict[str, object]) -> None:
    """Give each entry its class and hook behaviour; raise GenError listing every problem."""
    risky = {
        e.name: is_risky(e.name, any(p.type.replace("const ", "") == "CUstream" for p in e.params))
        for e in entries.values()
    }
    classes, problems = assign_classes(risky, rules)  # rules: epclass.py
    for name, cls in classes.items():
        entries[name].cls = cls

    def section(name: str) -> dict[str, object]:
        t = rules.get(name, {})
        if not isinstance(t, dict):
            raise GenError(f"classes.toml: [{name}] must be a table")
        return t

    for n in _names(section("gate_also")):
        if n not in entries:
            problems.append(f"{n}: in [gate_also] but not declared")
        else:
            entries[n].gated = True
    for n in _names(section("launch")):
        if n not in entries or entries[n].cls != "A":
            problems.append(f"{n}: in [launch] but not a declared class-A name")
        else:
            entries[n].launch = True
    for n, expr in section("stream").items():
        if n not in entries or not isinstance(expr, str):
            problems.append(f"{n}: bad [stream] entry")
        else:
            entries[n].stream = expr
    observe = section("observe")
    for when in ("pre", "post"):
        t = observe.get(when, {})
        if not isinstance(t, dict):
            raise GenError(f"classes.toml: [observe.{when}] must be a table")
        for n, stmt in t.items():
            if n not in entries or not isinstance(stmt, str):
                problems.append(f"{n}: bad [observe.{when}] entry")
            else:
                setattr(entries[n], when, stmt)
    for n, expr in section("oom_retry").items():
        if n not in entries or not isinstance(expr, str) or not expr.strip():
            problems.append(f"{n}: bad [oom_retry] entry")
        else:
            entries[n].oom_bytes = expr
    if problems:
        raise GenError("\n".join(sorted(problems)))

    for e in entries.values():
        if e.cls in ("A", "C"):
            e.gated = True
        e.ptsz = e.name.endswith(("_ptsz", "_ptds"))
        if e.gated and e.stream is None:
            for p in e.params:
                if p.type.replace("const ", "") == "CUstream":
                    e.stream = p.name
                    break
        e.hooked = e.gated or e.pre is not None or e.post is not None or e.oom_bytes is not None
        if e.gated:
            e.flags.append("KREX_EPF_GATED")
        if e.launch:
            e.flags.append("KREX_EPF_LAUNCH")
        if e.hooked:
            e.flags.append("KREX_EPF_HOOKED")
        if e.ptsz:
            e.flags.append("KREX_EPF_PTSZ")


# A documentation comment and the declaration it documents, in the raw cuda.h.
DOC_DECL = re.compile(r"/\*\*((?:(?!\*/).)*)\*/\s*CUresult\s+CUDAAPI\s+(cu\w+)\s*\(", re.S)
VERSION_SUFFIX = re.compile(r"(_v\d+)?(_ptsz|_ptds)?$")


def documented_oom(cuda_include: Path) -> set[str]:
    """Names whose cuda.h documentation lists ``CUDA_ERROR_OUT_OF_MEMORY`` among its returns."""
    text = (cuda_include / "cuda.h").read_text()
    return {m.group(2) for m in DOC_DECL.finditer(text) if "CUDA_ERROR_OUT_OF_MEMORY" in m.group(1)}


def check_oom(entries: dict[str, Entry], rules: dict[str, object], documented: set[str]) -> None:
    """Every declared form (``_v2``, ``_ptsz``, ...) of a name documented to fail with
    ``CUDA_ERROR_OUT_OF_MEMORY`` is retried (``[oom_retry]``) or reviewed
    (``[oom_reviewed]``); raise GenError listing the others."""
    table = rules.get("oom_reviewed", {})
    if not isinstance(table, dict):
        raise GenError("classes.toml: [oom_reviewed] must be a table")
    reviewed = set(_names(table))
    problems = [f"{n}: in [oom_reviewed] but not declared" for n in reviewed if n not in entries]
    for e in entries.values():
        base = VERSION_SUFFIX.sub("", e.name)
        if base in documented and e.oom_bytes is None and base not in reviewed:
            problems.append(
                f"{e.name}: cuda.h says it can fail with CUDA_ERROR_OUT_OF_MEMORY; list it "
                "under [oom_retry], or under [oom_reviewed] with the reason it is not retried"
            )
    if problems:
        raise GenError("\n".join(sorted(problems)))


BANNER = (
    "/* Generated by libkrex_shim/tools/gen_entrypoints.py from cuda.h (CUDA_VERSION {v})\n"
    " * and tools/classes.toml.  Do not edit; re-run the generator. */\n"
)


def render_header(entries: list[Entry], version: int) -> str:
    """entrypoints.gen.h: enum and table types."""
    out = [BANNER.format(v=version)]
    out.append("#ifndef KREX_ENTRYPOINTS_GEN_H\n#define KREX_ENTRYPOINTS_GEN_H\n\n")
    out.append("#include <stdint.h>\n\n")
    out.append(f"#define KREX_EP_CUDA_VERSION {version}\n\n")
    out.append("enum krex_ep {\n")
    for i, e in enumerate(entries):
        out.append(f"    KREX_EP_{e.name} = {i},\n")
    out.append(f"    KREX_EP_COUNT = {len(entries)}\n}};\n\n")
    out.append("#define KREX_EPF_GATED 0x1u  /* A, C and [gate_also]: counted and gated */\n")
    out.append("#define KREX_EPF_LAUNCH 0x2u /* counted as a kernel launch */\n")
    out.append("#define KREX_EPF_HOOKED 0x4u /* the shim exports a hook of this name */\n")
    out.append("#define KREX_EPF_PTSZ 0x8u   /* per-thread default stream family */\n\n")
    out.append(
        "struct krex_ep_desc {\n    const char *name;\n    char cls; /* 'A'..'D' */\n"
        "    uint8_t flags;\n};\n\n"
    )
    out.append("/* Sorted by name (strcmp order). */\n")
    out.append("extern const struct krex_ep_desc krex_ep_desc[KREX_EP_COUNT];\n")
    out.append("/* The hook's address, or NULL for an unhooked name. */\n")
    out.append("extern void *const krex_ep_hook[KREX_EP_COUNT];\n\n")
    out.append("#endif /* KREX_ENTRYPOINTS_GEN_H */\n")
    return "".join(out)


def _call_lines(e: Entry, indent: str, declare: bool) -> list[str]:
    """gate enter (or refuse) -> pre -> real -> post -> gate leave, one statement per line."""
    args = ", ".join(p.name for p in e.params)
    lines = []
    if e.gated:
        if e.stream is not None:
            lines.append(
                f"struct krex_slot *krex_s = krex_enter_stream({e.stream}, {1 if e.ptsz else 0});"
            )
        else:
            lines.append("struct krex_slot *krex_s = krex_enter();")
        lines.append(
            f"if (KREX_UNLIKELY(krex_s == KREX_REFUSED)) return krex_refused(KREX_EP_{e.name});"
        )
    if e.launch:
        lines.append("krex_count_launch();")
    if e.pre:
        lines.append(e.pre)
    lines.append(f"{'CUresult ' if declare else ''}krex_r = krex_real_fn({args});")
    if e.post:
        lines.append(e.post)
    if e.gated:
        lines.append("krex_leave(krex_s);")
    return [f"{indent}{line}\n" for line in lines]


def render_hook(e: Entry) -> str:
    """One exported hook: gate enter -> real -> observe -> gate leave.

    An ``[oom_retry]`` hook repeats that while ``krex_oom_retry()`` asks to
    (memory.c): the wait for co-tenants' memory happens outside the gate.
    """
    decl = ", ".join(f"{p.type} {p.name}" for p in e.params) or "void"
    lines = [f"KREX_HOOK CUresult {e.name}({decl})\n{{\n", f"    KREX_BIND({e.name});\n"]
    if e.oom_bytes is None:
        lines += _call_lines(e, "    ", declare=True)
    else:
        lines.append(
            "    struct krex_oom krex_o = KREX_OOM_INIT;\n    CUresult krex_r;\n    do {\n"
        )
        lines += _call_lines(e, "        ", declare=False)
        lines.append(
            "    } while (KREX_UNLIKELY(krex_r == CUDA_ERROR_OUT_OF_MEMORY || krex_o.waiting) &&\n"
            f"             krex_oom_retry(&krex_o, krex_r, (uint64_t)({e.oom_bytes})));\n"
        )
    lines.append("    return KREX_RESULT(krex_r);\n}\n\n")  # fatal errors: fault.c
    return "".join(lines)


def render_source(entries: list[Entry], version: int) -> str:
    """entrypoints.gen.c: the table and every hook."""
    out = [BANNER.format(v=version)]
    # The hooks are the top layer (docs/design/shim.md "Layering"): each
    # header they use, by what for.
    out.append('#include "base.h" /* cuda.h with every exported ABI declared */\n')
    out.append('#include "bind.h" /* krex_check_device */\n')
    out.append('#include "call.h" /* krex_enter, krex_leave: the per-call protocol */\n')
    out.append('#include "drain.h" /* krex_note_init */\n')
    out.append('#include "fault.h" /* KREX_RESULT */\n')
    out.append('#include "interpose.h" /* KREX_BIND, the table, cuGetProcAddress */\n')
    out.append('#include "memory.h" /* krex_oom_retry, device-memory accounting */\n')
    out.append('#include "region.h" /* the region record\'s observations */\n')
    out.append('#include "shim.h" /* krex_refused */\n')
    out.append('#include "track.h" /* contexts, streams, captures */\n\n')
    out.append(
        "#if CUDA_VERSION != KREX_EP_CUDA_VERSION\n"
        '#error "entrypoints.gen.c was generated from other CUDA headers: '
        'run tools/gen_entrypoints.py"\n#endif\n\n'
    )
    out.append(
        "/* cuda.h maps some names to others with macros; the hooks carry the\n"
        " * exported names themselves. */\n"
    )
    for e in entries:
        if e.hooked:
            out.append(f"#undef {e.name}\n")
    out.append("\n")
    for e in entries:
        if e.hooked:
            out.append(render_hook(e))
    out.append("const struct krex_ep_desc krex_ep_desc[KREX_EP_COUNT] = {\n")
    for e in entries:
        flags = " | ".join(e.flags) or "0"
        out.append(f"    {{\"{e.name}\", '{e.cls}', {flags}}},\n")
    out.append("};\n\n")
    out.append("void *const krex_ep_hook[KREX_EP_COUNT] = {\n")
    for e in entries:
        out.append(f"    (void *){e.name},\n" if e.hooked else "    NULL,\n")
    out.append("};\n")
    return "".join(out)


def generate(cuda_include: Path, classes: Path) -> dict[str, str]:
    """Return {file name: content} for the two generated files."""
    text, version = preprocess(cuda_include)
    entries = parse_declarations(text)
    with classes.open("rb") as f:
        rules = tomllib.load(f)
    classify(entries, rules)
    check_oom(entries, rules, documented_oom(cuda_include))
    ordered = [entries[n] for n in sorted(entries)]
    return {
        "entrypoints.gen.h": render_header(ordered, version),
        "entrypoints.gen.c": render_source(ordered, version),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line: write (or --check) the generated files; 0 ok, 1 stale, 2 error."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--cuda-include",
        type=Path,
        default=Path(os.environ.get("CUDA_INCLUDE", "/usr/local/cuda/include")),
    )
    ap.add_argument("--classes", type=Path, default=HERE / "classes.toml")
    ap.add_argument("--out-dir", type=Path, default=SHIM_DIR / "tenant")
    ap.add_argument("--check", action="store_true", help="compare instead of writing")
    ns = ap.parse_args(argv)
    try:
        files = generate(ns.cuda_include, ns.classes)
    except (GenError, tomllib.TOMLDecodeError, OSError) as exc:
        for line in str(exc).splitlines():
            print(f"gen_entrypoints: {line}", file=sys.stderr)
        return 2
    return write_outputs(files, ns.out_dir, ns.check, "gen_entrypoints")


if __name__ == "__main__":
    sys.exit(main())
