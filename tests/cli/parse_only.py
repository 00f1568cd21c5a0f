"""Run a program of this checkout only as far as its argument parsing, then exit 0.

``python parse_only.py SCRIPT.py ARGS...`` or ``python parse_only.py module:function
ARGS...``: ``argparse.ArgumentParser.parse_args`` is wrapped to exit 0 (printing
``PARSED``) once the arguments parsed; a wrong option or value fails as it would for
the user.  ``krex`` and ``krexctl`` (which parse with ``parse_known_args`` and check
the rest themselves) are parsed the way their ``main`` does.  A program that returns without
parsing exits 99.  Used by
tests/cli/test_doc_commands.py for documented commands that need a GPU or a krexd.
"""

from __future__ import annotations

import argparse
import importlib
import runpy
import sys
from typing import Any

_parse_args = argparse.ArgumentParser.parse_args
#: Entry points that parse with ``parse_known_args`` and report the rest themselves.
KNOWN_ARGS = ("krex_cli.main:main", "krex_cli.krexctl:main")


def _parse_then_exit(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
    _parse_args(self, *args, **kwargs)
    print("PARSED", file=sys.stderr)
    raise SystemExit(0)


def main() -> None:
    """Parse the arguments of the program named by ``sys.argv[1]``; never run it."""
    argparse.ArgumentParser.parse_args = _parse_then_exit  # type: ignore[method-assign]
    target, sys.argv = sys.argv[1], sys.argv[1:]
    if target.endswith(".py"):
        runpy.run_path(target, run_name="__main__")
    elif target in KNOWN_ARGS:  # parse_known_args, then their own check of the rest
        parser = importlib.import_module(target.split(":")[0]).build_parser()
        args, extra = parser.parse_known_args(sys.argv[1:])
        if extra:
            sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
            sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
        print("PARSED", file=sys.stderr)
        raise SystemExit(0)
    else:
        module, function = target.split(":")
        sys.argv[0] = module
        getattr(importlib.import_module(module), function)()
    print(f"{target} returned without parsing its arguments with argparse", file=sys.stderr)
    raise SystemExit(99)


if __name__ == "__main__":
    main()
