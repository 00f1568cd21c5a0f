"""The functions the HIP headers declare, for gen_hip_entrypoints.py.

The headers are read through the C preprocessor (``-D__HIP_PLATFORM_AMD__``)
twice:

* as C: ``hip_runtime.h`` (with ``hip_runtime_api.h`` and
  ``amd_detail/amd_hip_runtime_pt_api.h``, the ``_spt`` per-thread-stream
  forms), ``hiprtc.h`` and ``amd_detail/hip_runtime_prof.h`` (the profiler's
  callbacks; exported, included by no other header).  This is the C API:
  a name declared here has C linkage (the library exports it, if at all,
  under its own name), and its prototype is the one kept (a C++
  declaration of the same name only adds default arguments).
* as C++, with ``hip_ext.h`` too: it adds the names that only C++ declares.
  Some of those have C++ linkage (``hipExtModuleLaunchKernel``,
  ``hipHccModuleLaunchKernel``, ``hipCreateSurfaceObject``,
  ``hipDestroySurfaceObject`` in HIP 5.2): the library exports them under
  their mangled names, which :func:`mangled_symbols` asks g++ for.

Skipped, with the reason: templates and ``static inline`` helpers
(``hipMalloc<T>``, ``hipLaunchKernelGGL``, ``hipMallocAsync`` overloads,
``hipCreateChannelDesc<T>``): they are compiled into the application and call
the exported entry points, which the table has; anything in a C++ namespace
(``hip_impl::``, internal); and declarations from headers outside the HIP
include directory.  A declaration is kept when its name starts with ``hip``
or ``__hip`` (``__hipPushCallConfiguration``, which ``<<<...>>>`` calls).
"""

from __future__ import annotations

import os
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from epclass import PARAM_NAME, TYPE_WORDS, GenError

C_HEADERS = ("hip_runtime.h", "hiprtc.h", "amd_detail/hip_runtime_prof.h")
CXX_HEADERS = C_HEADERS + ("hip_ext.h",)
DEFINES = ("-D__HIP_PLATFORM_AMD__",)

NAME = re.compile(r"\b((?:__)?hip\w*)\s*\(")
LINE_MARKER = re.compile(r'^#\s*\d+\s+"([^"]*)"')
EXTERN_C = re.compile(r'^extern\s*"C"\s*')
LINKAGE_BLOCK = re.compile(r'^extern\s*"(C|C\+\+)"$')


@dataclass
class Param:
    """One parameter: its C type text and its name."""

    type: str
    name: str


@dataclass
class Decl:
    """One declared entry point: its prototype and where it comes from."""

    name: str
    ret: str
    params: list[Param]
    header: str  # path relative to the include directory
    cxx: bool = False  # C++ linkage: exported as `symbol`, a mangled name
    symbol: str = ""

    def prototype(self) -> str:
        """The declaration as C text, without attributes or default arguments."""
        params = ", ".join(f"{p.type} {p.name}" for p in self.params) or "void"
        return f"{self.ret} {self.name}({params})"


def default_include() -> Path:
    """``$HIP_INCLUDE``, else ``/usr/include/hip`` if present, else ``/opt/rocm/include/hip``."""
    env = os.environ.get("HIP_INCLUDE")
    if env:
        return Path(env)
    debian = Path("/usr/include/hip")
    return debian if debian.is_dir() else Path("/opt/rocm/include/hip")


def hip_version(include: Path) -> tuple[int, int, int]:
    """(major, minor, patch) from ``hip_version.h``; GenError when it is missing."""
    path = include / "hip_version.h"
    if not path.is_file():
        raise GenError(f"hip_version.h not found in {include} (set HIP_INCLUDE or --hip-include)")
    text = path.read_text()
    parts = []
    for what in ("MAJOR", "MINOR", "PATCH"):
        m = re.search(rf"^#define HIP_VERSION_{what} (\d+)\s*$", text, re.M)
        if not m:
            raise GenError(f"hip_version.h does not define HIP_VERSION_{what}")
        parts.append(int(m.group(1)))
    return parts[0], parts[1], parts[2]


def present(include: Path, names: tuple[str, ...]) -> list[str]:
    """Those of ``names`` (paths relative to ``include``) that exist, in order."""
    return [h for h in names if (include / h).is_file()]


def preprocess(include: Path, lang: str) -> str:
    """The preprocessed text (line markers kept) of the headers for ``lang`` ("c" or "c++")."""
    if not (include / "hip_runtime_api.h").is_file():
        raise GenError(f"hip_runtime_api.h not found in {include} (set HIP_INCLUDE)")
    headers = present(include, C_HEADERS if lang == "c" else CXX_HEADERS)
    source = "".join(f"#include <hip/{h}>\n" for h in headers)
    cc = "gcc" if lang == "c" else "g++"
    cmd = [cc, "-E", *DEFINES, f"-I{include.parent}", "-x", lang, "-"]
    out = subprocess.run(cmd, input=source, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        raise GenError(f"preprocessing the HIP headers as {lang} failed: {out.stderr.strip()}")
    return out.stdout


@dataclass
class Statement:
    """A top-level declaration: its text, file and linkage."""

    text: str
    file: str
    extern_c: bool


def _skip_literal(line: str, i: int) -> int:
    """Index just past the string or character literal that starts at ``line[i]``."""
    quote = line[i]
    i += 1
    while i < len(line) and line[i] != quote:
        i += 2 if line[i] == "\\" else 1
    return i + 1


def statements(text: str) -> list[Statement]:
    """Split preprocessed text into top-level declarations.

    Bodies are skipped: a function definition (or namespace, or anything
    after ``template``) is dropped whole; a struct, enum or initializer body
    becomes ``{}`` in its declaration.  ``extern "C" { ... }`` blocks set the
    linkage of what they hold.  Raises GenError on an unbalanced ``}``.
    """
    out: list[Statement] = []
    file = ""
    stmt: list[str] = []
    stmt_file = ""
    linkage: list[bool] = []
    depth = 0  # inside a skipped body
    drop = False  # the skipped body ends its statement
    for line in text.splitlines():
        if line.startswith("#"):
            m = LINE_MARKER.match(line)
            if m:
                file = m.group(1)
            continue  # line markers and #pragma lines
        i = 0
        while i < len(line):
            ch = line[i]
            if ch in "\"'":
                j = _skip_literal(line, i)
                if depth == 0:
                    stmt.append(line[i:j])
                i = j
                continue
            i += 1
            if depth:
                if ch == "{":
                    depth += 1
                elif ch == "}":
                    depth -= 1
                    if depth == 0:
                        if drop:
                            stmt = []
                        else:
                            stmt.append("{}")
                continue
            if not stmt and ch.isspace():
                continue
            if not stmt:
                stmt_file = file
            if ch == "{":
                head = " ".join("".join(stmt).split())
                block = LINKAGE_BLOCK.match(_strip_attributes(head))
                if block:
                    linkage.append(block.group(1) == "C")
                    stmt = []
                    continue
                depth = 1
                drop = head.startswith(("namespace", "template")) or bool(
                    re.search(r"\)\s*(const|noexcept)?$", head)
                )
                continue
            if ch == "}":
                if linkage and not "".join(stmt).strip():
                    linkage.pop()
                    stmt = []
                    continue
                raise GenError(f"unbalanced '}}' in {file}")
            if ch == ";":
                text_ = " ".join("".join(stmt).split())
                out.append(Statement(text_, stmt_file, bool(linkage) and linkage[-1]))
                stmt = []
                continue
            stmt.append(ch)
        if stmt:
            stmt.append(" ")
    return out


def _strip_attributes(text: str) -> str:
    """``text`` without ``__attribute__((...))``, ``__declspec(...)`` and ``[[...]]``.

    Raises GenError when such a word is not followed by a balanced ``(...)``.
    """
    for word in ("__attribute__", "__declspec"):
        while (k := text.find(word)) >= 0:
            j = k + len(word)
            while j < len(text) and text[j].isspace():
                j += 1
            depth, end, m = 0, -1, j
            while m < len(text):
                if text[m] in "\"'":
                    m = _skip_literal(text, m)
                    continue
                if text[m] == "(":
                    depth += 1
                elif text[m] == ")":
                    depth -= 1
                    if depth == 0:
                        end = m
                        break
                if depth == 0:
                    break  # not a parenthesis
                m += 1
            if end < 0:
                raise GenError(f"unbalanced {word} in: {text}")
            text = text[:k] + " " + text[end + 1 :]
    text = re.sub(r"\[\[.*?\]\]", " ", text)
    return " ".join(text.split())


def _split_top(text: str, sep: str) -> list[str]:
    """Split at ``sep`` outside parentheses and brackets.

    Angle brackets do not nest here (``1 << 2`` in a default argument): a
    template type, which no parsed declaration has, would split and then fail
    to parse, loudly.
    """
    parts: list[str] = []
    cur: list[str] = []
    depth = 0
    for ch in text:
        if ch in "([":
            depth += 1
        elif ch in ")]":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return parts


def _type_text(text: str) -> str:
    """Type text in the table's spelling: single spaces, ``T*`` and ``T**``."""
    t = " ".join(text.split())
    t = re.sub(r"\s*\*", "*", t)
    return t


def parse_params(name: str, text: str) -> list[Param]:
    """Parameters of ``name`` from its list; default arguments (C++) dropped.

    Raises GenError on a parameter without a name, a variadic list, a C++
    reference, or an array or function-pointer parameter (none in HIP 5.2:
    function pointers come through typedefs such as ``hipStreamCallback_t``).
    """
    text = " ".join(text.split())
    if text in ("", "void"):
        return []
    params = []
    for raw in _split_top(text, ","):
        raw = _split_top(raw, "=")[0].strip()
        if raw == "..." or any(c in raw for c in "()[]&"):
            raise GenError(f"{name}: unsupported parameter syntax: {raw!r}")
        m = PARAM_NAME.match(raw)
        if not m or m.group("name") in TYPE_WORDS or not m.group("type").strip():
            raise GenError(f"{name}: parameter without a name: {raw!r}")
        ptype = _type_text(m.group("type"))
        if ptype in ("const", "struct", "enum", "union"):
            raise GenError(f"{name}: parameter without a name: {raw!r}")
        params.append(Param(ptype, m.group("name")))
    return params


def parse_declaration(stmt: Statement, include: Path) -> Decl | None:
    """The entry point ``stmt`` declares, or None when it declares no hip function."""
    text = _strip_attributes(stmt.text)
    extern_c = stmt.extern_c or bool(EXTERN_C.match(text))
    text = EXTERN_C.sub("", text)
    if text.startswith(("typedef ", "using ", "template", "static ", "namespace ")):
        return None
    m = NAME.search(text)
    if not m:
        return None
    ret = re.sub(r"^(extern|inline|__inline__)\s+", "", text[: m.start()].strip())
    if not ret or any(c in ret for c in "(){}=,"):
        return None  # a call in an initializer, a function pointer, ...
    open_ = m.end() - 1
    depth, close = 0, -1
    for k in range(open_, len(text)):
        if text[k] == "(":
            depth += 1
        elif text[k] == ")":
            depth -= 1
            if depth == 0:
                close = k
                break
    tail = text[close + 1 :].strip() if close >= 0 else "?"
    if tail not in ("", "noexcept", "throw()"):
        raise GenError(f"{m.group(1)}: unsupported declaration: {stmt.text}")
    name = m.group(1)
    try:
        header = str(Path(stmt.file).resolve().relative_to(include.resolve()))
    except ValueError:
        return None  # not a HIP header
    return Decl(
        name,
        _type_text(ret),
        parse_params(name, text[open_ + 1 : close]),
        header,
        cxx=not extern_c,
        symbol=name,
    )


def declarations(include: Path, lang: str) -> dict[str, Decl]:
    """Every hip function declared for ``lang``, by name.

    A name declared twice must have the same prototype both times (GenError).
    """
    stmts = statements(preprocess(include, lang))
    found: dict[str, Decl] = {}
    for s in stmts:
        d = parse_declaration(s, include)
        if d is None:
            continue
        if lang == "c":
            d.cxx = False
        old = found.get(d.name)
        if old is not None and (old.prototype(), old.cxx) != (d.prototype(), d.cxx):
            raise GenError(
                f"{d.name}: declared twice, differently: {old.prototype()} / {d.prototype()}"
            )
        found.setdefault(d.name, d)
    return found


def mangled_symbols(include: Path, decls: list[Decl]) -> dict[str, str]:
    """The exported (mangled) symbol of each C++-linkage declaration, from g++.

    Compiles the HIP headers as C++ with each prototype declared again and
    its address taken, and reads the referenced symbols off the assembly:
    the mangled name encodes the parameter types as the prototype has them,
    so a symbol the library does not export means a wrong prototype
    (tests/shim/test_hip_generated.py checks against the export list).
    """
    if not decls:
        return {}
    lines = ["#include <hip/hip_runtime.h>"]
    for i, d in enumerate(decls):
        lines.append(f"{d.prototype()};")
        lines.append(f"void *krex_ref_{i} = (void *)&{d.name};")
    cmd = ["g++", "-S", "-o", "-", *DEFINES, f"-I{include.parent}", "-x", "c++", "-"]
    out = subprocess.run(
        cmd, input="\n".join(lines) + "\n", capture_output=True, text=True, check=False
    )
    if out.returncode != 0:
        raise GenError(f"g++ could not compile the C++ prototypes: {out.stderr.strip()}")
    symbols: dict[str, str] = {}
    for d in decls:
        prefix = f"_Z{len(d.name)}{d.name}"
        found = sorted(set(re.findall(rf"\b{prefix}\w*", out.stdout)))
        if len(found) != 1:
            raise GenError(f"{d.name}: no single mangled symbol in g++'s output: {found}")
        symbols[d.name] = found[0]
    return symbols


def read_all(include: Path) -> dict[str, Decl]:
    """The C declarations, plus the C++-only ones with their symbols, by name.

    Raises GenError (headers missing or not understood, g++ failing).
    """
    decls = declarations(include, "c")
    cxx = declarations(include, "c++")
    only_cxx = [cxx[n] for n in sorted(cxx) if n not in decls]
    for d in only_cxx:
        decls[d.name] = d
    for name, sym in mangled_symbols(include, [d for d in only_cxx if d.cxx]).items():
        decls[name].symbol = sym
    if not decls:
        raise GenError(f"no hip declarations found in {include}")
    return decls
