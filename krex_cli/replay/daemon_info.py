"""What ``krex replay`` asks of krexd before a run: its GPUs, its slots, the default concurrency.

Without ``--concurrency`` the krex and ungated modes run as many commands
per GPU as krexd offers slots (:func:`default_concurrency`): a running krexd
(``--socket``) as its ``status`` reports them (the fewest of the GPUs used),
the krexd the replay starts as its base config sets them: a fixed
``[admission] slots_per_gpu`` of ``--config`` or the shipped
``etc/krex.toml``, or, where the count is ``"auto"`` (krexd's default,
derived per GPU from its cores and memory), what that krexd's ``status``
reports once it is up (:func:`started_slots`).  The replay says on stderr
which it took and why.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from krex_cli.replay import modes


def daemon_status(socket: str) -> dict[str, Any] | None:
    """The ``status`` reply of the krexd at ``socket``; None when it cannot say."""
    from krex_client.connection import Connection, KrexUnavailable, RemoteError

    try:
        with Connection(socket, timeout_s=5.0) as conn:
            return dict(conn.request("status"))
    except (KrexUnavailable, RemoteError):
        return None


def daemon_gpus(socket: str) -> list[int]:
    """GPU indices the krexd at ``socket`` manages (``status``); [] when it cannot say."""
    status = daemon_status(socket) or {}
    return [int(g["index"]) for g in status.get("gpus", [])]


def daemon_slots(socket: str, gpus: Sequence[int]) -> int | None:
    """Slots per GPU of the krexd at ``socket``: the fewest among ``gpus`` (None: unknown)."""
    status = daemon_status(socket) or {}
    slots = [int(g["slots_total"]) for g in status.get("gpus", []) if int(g["index"]) in gpus]
    return min(slots) if slots else None


def config_slots(base: Path | None) -> tuple[int | None, str]:
    """``[admission] slots_per_gpu`` of the krexd config ``base`` and where it came from.

    Returns ``(slots, source)``: the config's value when it fixes one (an
    integer >= 1), else ``None``: krexd derives the count itself (``"auto"``,
    its default; ``krexd.config.slot_count``), known only from its ``status``.
    """
    table, key = modes.CONCURRENCY_KEY
    if base is not None:
        try:
            cfg = tomllib.loads(base.read_text(encoding="utf-8"))
        except (OSError, tomllib.TOMLDecodeError):
            cfg = {}
        value = (cfg.get(table) or {}).get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
            return value, f"[{table}] {key} of {base}"
    return None, f'[{table}] {key} = "auto"'


def default_concurrency(
    mode: str, socket: str | None, gpus: Sequence[int], base: Path | None
) -> tuple[int | None, str | None]:
    """Commands per GPU for ``mode`` when ``--concurrency`` is not given, and why.

    Args:
        mode: the ``--mode`` name.
        socket: ``--socket`` (a running krexd), or None (the replay starts one).
        gpus: the GPU indices the replay uses.
        base: the base config of the krexd the replay starts.

    Returns:
        ``(concurrency, note)``: ``note`` is the line to say (None for native
        and serial, which run one command per GPU by definition).
        ``concurrency`` is None when the started krexd derives its slots
        (``"auto"``): :func:`started_slots` asks it once it is up.
    """
    if mode not in ("krex", "ungated"):
        return 1, None
    if socket is not None:
        slots = daemon_slots(socket, gpus)
        if slots is None:
            return 1, f"--concurrency 1: the krexd at {socket} did not report its slots"
        return slots, f"--concurrency {slots}: the slots per GPU the krexd at {socket} reports"
    slots, source = config_slots(base)
    if slots is None:
        return None, None
    return slots, f"--concurrency {slots}: the slots per GPU its krexd gets ({source})"


def started_slots(socket: str, gpus: Sequence[int]) -> tuple[int, str]:
    """Slots per GPU of the krexd the replay started with ``"auto"`` slots, and the line to say.

    Raises:
        modes.ModeError: that krexd does not report its slots.
    """
    slots = daemon_slots(socket, gpus)
    if slots is None:
        raise modes.ModeError(f"the krexd at {socket} did not report its slots")
    rule = '[admission] slots_per_gpu = "auto"'
    return slots, f"--concurrency {slots}: the slots per GPU its krexd derived ({rule})"
