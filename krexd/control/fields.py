"""Typed access to a request body; a missing or mistyped field raises KrexError(BAD_FIELD)."""

from __future__ import annotations

from typing import Any

from krexd.system.errors import Code, KrexError

_MISSING = object()


def _bad(name: str, what: str) -> KrexError:
    return KrexError(Code.BAD_FIELD, f"body field '{name}' {what}")


def integer(
    body: dict[str, Any], name: str, lo: int = 0, hi: int = (1 << 63) - 1, default: Any = _MISSING
) -> Any:
    """Integer field in [lo, hi]; ``default`` (may be None) when absent, else required."""
    v = body.get(name, _MISSING)
    if v is _MISSING or v is None:
        if default is _MISSING:
            raise _bad(name, "is required")
        return default
    if not isinstance(v, int) or isinstance(v, bool):
        raise _bad(name, f"must be an integer, got {type(v).__name__}")
    if not lo <= v <= hi:
        raise _bad(name, f"must be in [{lo}, {hi}], got {v}")
    return v


def number(body: dict[str, Any], name: str, default: Any = _MISSING) -> Any:
    """Float field (ints accepted), ≥ 0; ``default`` when absent, else required."""
    v = body.get(name, _MISSING)
    if v is _MISSING or v is None:
        if default is _MISSING:
            raise _bad(name, "is required")
        return default
    if not isinstance(v, int | float) or isinstance(v, bool) or not v >= 0:
        raise _bad(name, f"must be a number >= 0, got {v!r}")
    return float(v)


def boolean(body: dict[str, Any], name: str, default: bool = False) -> bool:
    """Boolean field, ``default`` when absent."""
    v = body.get(name, default)
    if not isinstance(v, bool):
        raise _bad(name, f"must be true or false, got {type(v).__name__}")
    return v


def string(body: dict[str, Any], name: str, max_len: int, default: Any = _MISSING) -> Any:
    """``body[name]``: a non-empty string of at most ``max_len`` characters.

    An absent or None field gives ``default`` when one is given (like
    :func:`integer`), else raises ``KrexError(BAD_FIELD)``.
    """
    if body.get(name) is None and default is not _MISSING:
        return default
    v = body.get(name)
    if not isinstance(v, str) or not v or len(v) > max_len:
        raise _bad(name, f"must be a non-empty string of at most {max_len} characters")
    return v


def str_list(body: dict[str, Any], name: str, max_items: int = 4096) -> list[str]:
    """Required non-empty list of strings."""
    v = body.get(name, _MISSING)
    if v is _MISSING:
        raise _bad(name, "is required")
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise _bad(name, "must be a non-empty list of strings")
    if len(v) > max_items:
        raise _bad(name, f"has more than {max_items} items")
    return list(v)


def only(body: dict[str, Any], *names: str) -> None:
    """Refuse body fields other than ``names``."""
    extra = sorted(k for k in body if k not in names)
    if extra:
        raise _bad(extra[0], f"is not a field of this op (fields: {', '.join(names) or 'none'})")
