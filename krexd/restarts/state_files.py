"""krexd's files in its state directory, made at start: the GPUs' gates, the learned needs.

Both are named after the cgroup tree (``[cgroup] name``): krexds sharing a
state directory (different names, which the tree lock enforces) never
share a file.
"""

from __future__ import annotations

import grp
import logging
import os

from krexd.config.config import Config
from krexd.gate import GATE_MODE, Gate, GateError, Judge
from krexd.memory.learned import LearnedNeeds
from krexd.system import paths

_log = logging.getLogger("krexd")


def create_gate(
    config: Config, gpu: int, judge: Judge | None = None
) -> tuple[Gate | None, str | None]:
    """GPU ``gpu``'s gate and its path; (None, None) without ``libkrex_gate.so``.

    ``judge`` verifies pending owners in its drains (``krexd.gate.Gate``;
    krexd's is ``krexd.tenancy.registrations.Verifier.judge``).

    The gate is ``<state_dir>/<cgroup name>-gpu<N>.gate`` (root's, mode
    0644; with ``[daemon] socket_group``, group that group and mode 0640:
    only who may connect may read it), with a second link under
    ``<state_dir>/.krex-keep/`` (mode 0700).
    Raises GateError with one line naming the directory when the gate
    cannot be made there (a full file system: its space is reserved now).
    """
    if paths.gate_library() is None:
        return None, None
    cfg = config.daemon
    keep_dir = os.path.join(cfg.gate_dir, ".krex-keep")
    try:
        os.makedirs(cfg.gate_dir, mode=0o755, exist_ok=True)
        os.makedirs(keep_dir, mode=0o700, exist_ok=True)
        os.chmod(keep_dir, 0o700)
    except OSError as exc:
        raise GateError(f"cannot create gate directory {cfg.gate_dir}: {exc.strerror}") from None
    # Named after the cgroup tree too: krexds sharing a state directory
    # (different [cgroup] names, which the tree lock enforces) never share a gate.
    name = f"{config.cgroup.name}-gpu{gpu}.gate"
    path = os.path.join(cfg.gate_dir, name)
    gid = _group_id(cfg.socket_group)
    try:
        # Root's, 0644 (0640 to the socket's group): tenants map it read-only, krexd
        # alone writes it.
        mode = GATE_MODE if gid is None else GATE_MODE & ~0o004
        gate = Gate.create(path, gpu, mode=mode, keep=os.path.join(keep_dir, name), judge=judge)
        if gid is not None:
            try:
                os.chown(path, 0, gid)
            except OSError as exc:
                raise GateError(f"chown: {exc.strerror}", exc.errno or 0) from None
    except GateError as exc:
        raise GateError(
            f"cannot create the gate of GPU {gpu} in {cfg.gate_dir}: "
            f"{os.strerror(exc.errno) if exc.errno else exc}",
            exc.errno,
        ) from None
    return gate, path


def _group_id(group: str) -> int | None:
    """The gid of ``[daemon] socket_group`` (None when none is set or it does not exist;
    the server refuses a group that does not exist)."""
    if not group:
        return None
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        return None


def learned_needs(config: Config) -> LearnedNeeds:
    """Learned memory needs, kept in ``[memory] learned_file``, by default
    ``<state_dir>/<cgroup name>-learned-memory.json``.

    When the file's directory cannot be made, the needs are kept in memory
    only (logged as an error).
    """
    cfg = config
    default = os.path.join(cfg.daemon.gate_dir, f"{cfg.cgroup.name}-learned-memory.json")
    path: str | None = cfg.memory.learned_file or default
    try:
        os.makedirs(os.path.dirname(path or default), mode=0o755, exist_ok=True)
    except OSError as exc:
        _log.error("learned memory needs kept in memory only: %s", exc)
        path = None
    return LearnedNeeds(path, cfg.memory.learned_max, cfg.memory.learned_per_uid)
