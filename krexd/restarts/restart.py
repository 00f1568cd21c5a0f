"""Stop or restart: what krexd does when it is asked to exit, and what it keeps for its successor.

SIGTERM with the restart marker (``krexd --prepare-restart``) is a restart:
krexd saves and exits, leaving tenants, frozen siblings and gates for the
next krexd to adopt; without it, a stop ends every command.
:class:`Continuity` owns what outlives a krexd (the state file, the
heartbeat, the watchdog).  docs/design/daemon.md "Restarts"; docs/install.md
"What each action does to running commands".
"""

from __future__ import annotations

import asyncio
import logging
import os
import subprocess
import time
from collections.abc import Mapping

from krexd.config.config import Config
from krexd.orchestration.gpu import Gpu
from krexd.restarts import saved_state, watchdog
from krexd.restarts.state_keeper import StateKeeper
from krexd.tenancy.tenants import TenantRegistry

_log = logging.getLogger("krexd.restart")

MARKER_MAX_AGE_S = 300.0  # an older marker is a leftover, not this stop's intent
STOPPED_REASON = "krexd was stopped (systemctl stop or SIGTERM) and ended the command"


def marker_path(cfg: Config) -> str:
    """The restart marker of this krexd's tree."""
    return os.path.join(cfg.daemon.gate_dir, f"{cfg.cgroup.name}.restart")


def prepare_restart(cfg: Config) -> None:
    """Say that the next SIGTERM is for a restart (``krexd --prepare-restart``; root only)."""
    os.makedirs(cfg.daemon.gate_dir, mode=0o755, exist_ok=True)
    path = marker_path(cfg)
    with open(path, "w") as f:
        f.write(f"{time.time()}\n")


def take_restart_intent(cfg: Config) -> bool:
    """True when a fresh restart marker exists; the marker is removed either way."""
    path = marker_path(cfg)
    try:
        age = time.time() - os.stat(path).st_mtime
        os.unlink(path)
    except FileNotFoundError:
        return False
    return age <= MARKER_MAX_AGE_S


class Continuity:
    """State, heartbeat and watchdog of one krexd.

    Args:
        cfg: krexd's configuration (state_dir, cgroup name, freeze_bound_s).
        cgroup_root: krexd's cgroup tree.
        registry: the live tenants.
        gpus: the GPUs (regions, gates).
        restarts: restarts this krexd continues from (``restarts.counters``), saved for the next.
    """

    def __init__(
        self,
        cfg: Config,
        cgroup_root: str,
        registry: TenantRegistry,
        gpus: Mapping[int, Gpu],
        restarts: int = 0,
    ) -> None:
        self._cfg = cfg
        self._root = cgroup_root
        self._gpus = gpus
        path = saved_state.path_for(cfg.daemon.gate_dir, cfg.cgroup.name)
        self.keeper = StateKeeper(path, cgroup_root, registry, gpus, restarts)
        self.heartbeat = watchdog.Heartbeat(
            watchdog.heartbeat_path(cfg.daemon.gate_dir, cfg.cgroup.name)
        )
        self._watchdog: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Save the state once and start the watchdog process."""
        self.keeper.save()
        gates = [g.gate_path for g in self._gpus.values() if g.gate_path]
        self._watchdog = watchdog.spawn(
            self.heartbeat.path,
            self._root,
            gates,
            self._cfg.daemon.freeze_bound_s,
            self._cfg.daemon.socket,
        )
        _log.info(
            "watchdog pid %d: thaws the tree %g s after krexd's last heartbeat",
            self._watchdog.pid,
            self._cfg.daemon.freeze_bound_s,
        )

    async def loop(self) -> None:
        """Beat and save every second (a hung loop stops both) until cancelled."""
        while True:
            await asyncio.sleep(watchdog.BEAT_S)
            self.heartbeat.beat()  # logs once when it fails
            self.keeper.save()
            if self._watchdog is not None and self._watchdog.poll() is not None:
                _log.warning("watchdog exited (%s); starting it again", self._watchdog.returncode)
                self.start()

    def leave_for_restart(self) -> None:
        """Restart: save the state for the successor; the watchdog keeps watching."""
        self.keeper.save()
        _log.warning(
            "exiting for a restart: %d tenant(s) keep running",
            len(self.keeper.snapshot()["tenants"]),
        )

    def full_stop(self) -> None:
        """Stop: nothing is left to adopt; the watchdog exits when the heartbeat goes."""
        self.keeper.remove()
        self.heartbeat.remove()
        if self._watchdog is not None:
            try:
                self._watchdog.wait(5.0)
            except subprocess.TimeoutExpired:
                self._watchdog.kill()
                self._watchdog.wait()
