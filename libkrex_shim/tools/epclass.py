"""Entry-point classification shared by the CUDA and HIP table generators.

``gen_entrypoints.py`` (CUDA driver, ``classes.toml``) and
``gen_hip_entrypoints.py`` (HIP runtime, ``hip_classes.toml``) put every
declared entry point in one of four classes, A/B/C/D (docs/design/shim.md
"Classification").  The rules, the same for both:

* explicit lists (``[A] names``, ``[B] names``, ``[C] names``, ``[D] names``,
  ``[D] reviewed``) win over the patterns of ``[D] patterns``;
* a name in two classes, a listed name the header does not declare, and a
  declared name in no list and matching no pattern are errors;
* a name that may do device work (see :func:`is_risky`) reaches D only
  through ``[D] reviewed``, where a comment says why it does none.
"""

from __future__ import annotations

import fnmatch
import re
import sys
from collections.abc import Mapping
from pathlib import Path

# Words that mark an entry point as possibly doing device work: such a name
# may not reach class D through a pattern (graph-node API excepted).
RISKY = re.compile(r"Launch|Memcpy|Memset|Async|Prefetch|Upload|Synchron|Record|Wait|Signal")


#: A parameter: its type text, then its name (the last identifier).
PARAM_NAME = re.compile(r"^(?P<type>.*?[\s*])(?P<name>[A-Za-z_][A-Za-z0-9_]*)$")
#: Words a parameter's last identifier may be without being its name (an unnamed one).
TYPE_WORDS = frozenset(
    {"int", "unsigned", "char", "short", "long", "float", "double", "void", "const", "size_t",
     "signed", "struct", "enum", "union", "bool"}
)  # fmt: skip


class GenError(Exception):
    """Problems found in a header or a classification (one message per line)."""


def names(
    table: Mapping[str, object], key: str = "names", source: str = "classes.toml"
) -> list[str]:
    """The list of names under ``key`` of ``table`` (empty when absent).

    Raises GenError, naming ``source``, when the value is not a list of strings.
    """
    value = table.get(key, [])
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise GenError(f"{source}: '{key}' must be a list of names")
    return list(value)


def is_risky(name: str, takes_stream: bool) -> bool:
    """True when the entry point may do device work: it takes a stream, or its
    name says it launches, copies, sets, waits, signals, records, uploads or
    prefetches, outside the graph-node API (which only edits graphs)."""
    return takes_stream or (RISKY.search(name) is not None and "Node" not in name)


def assign_classes(
    risky: Mapping[str, bool],
    rules: Mapping[str, object],
    header: str = "cuda.h",
    source: str = "classes.toml",
) -> tuple[dict[str, str], list[str]]:
    """Class of each declared name by the rules of the module docstring.

    ``risky`` maps every declared name to :func:`is_risky`; ``rules`` is the
    parsed TOML; ``header`` and ``source`` name the two in messages.  Returns
    (name -> class for the names that got one, problems).  Raises GenError
    when a class section is not a TOML table or a list is not of names.
    """
    problems: list[str] = []
    explicit: dict[str, str] = {}
    reviewed: set[str] = set()
    for cls in "ABCD":
        table = rules.get(cls, {})
        if not isinstance(table, dict):
            raise GenError(f"{source}: [{cls}] must be a table")
        listed = names(table, source=source)
        if cls == "D":
            reviewed = set(names(table, "reviewed", source))
            listed = listed + sorted(reviewed)
        for n in listed:
            if n in explicit and explicit[n] != cls:
                problems.append(f"{n}: listed in both {explicit[n]} and {cls}")
            explicit[n] = cls
            if n not in risky:
                problems.append(f"{n}: listed in [{cls}] but not declared in {header}")
    d_table = rules.get("D", {})
    patterns = names(d_table, "patterns", source) if isinstance(d_table, dict) else []
    classes: dict[str, str] = {}
    for name, may_work in risky.items():
        if name in explicit:
            classes[name] = explicit[name]
            # A name that may do device work reaches D only through
            # [D] reviewed, where each one says why it does not.
            if classes[name] == "D" and may_work and name not in reviewed:
                problems.append(
                    f"{name}: may do device work; classify it in A/B/C, or list it "
                    "under [D] reviewed with the reason it does not"
                )
            continue
        if not any(fnmatch.fnmatchcase(name, p) for p in patterns):
            problems.append(f"{name}: unclassified (add it to {source})")
            continue
        if may_work:
            problems.append(
                f"{name}: may do device work; classify it explicitly, not by a D pattern"
            )
            continue
        classes[name] = "D"
    return classes, problems


def write_outputs(files: Mapping[str, str], out_dir: Path, check: bool, prog: str) -> int:
    """Write each generated file under ``out_dir``, or with ``check`` compare it.

    Returns the exit status: 0 written or current, 1 (with one line on stderr
    naming ``prog`` and the stale files) when ``check`` finds a file out of date.
    """
    stale = []
    for name, content in files.items():
        path = out_dir / name
        if check:
            if not path.is_file() or path.read_text() != content:
                stale.append(name)
        else:
            path.write_text(content)
    if stale:
        print(f"{prog}: out of date: {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0
