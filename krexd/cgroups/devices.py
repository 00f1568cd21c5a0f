"""Device isolation: a tenant's processes can open its own GPU's device node and no other.

``[gpu] device_isolation`` (``auto``, ``require``, ``off``), what each tenant
and pool cgroup is let open, and the limits: docs/design/security.md "6. GPU
binding".  Simulated GPU N has device minor N, simulated AMD GPU N render
minor 128 + N (tests make such nodes with ``mknod``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping, Sequence

from krexd.cgroups import bpf, fs
from krexd.cgroups.fs import CgroupError
from krexd.config.config import ConfigError

_log = logging.getLogger("krexd.cgroups")

AUTO = "auto"
REQUIRE = "require"
OFF = "off"
#: The scratch cgroup of the start-up probe, under krexd's tree root.
PROBE_DIR = "device-probe"


class DeviceIsolation:
    """Which device program each cgroup of one krexd gets, and whether any.

    Args:
        mode: ``[gpu] device_isolation`` (:data:`AUTO`, :data:`REQUIRE`, :data:`OFF`).
        minors: the device minor of each managed NVIDIA GPU, by GPU index (None: unknown).
        render_minors: the render node minor of each managed AMD GPU, by GPU index.
        unmanaged_render: the render node minors of the host's AMD GPUs krexd does
            not manage (KFD topology; denied to every tenant and pool).

    Inactive until :meth:`probe` finds it works.
    """

    def __init__(
        self,
        mode: str = OFF,
        minors: Mapping[int, int | None] | None = None,
        render_minors: Mapping[int, int | None] | None = None,
        unmanaged_render: Sequence[int] = (),
    ) -> None:
        self.mode = mode
        self.minors = dict(minors or {})
        self.render_minors = dict(render_minors or {})
        self.unmanaged_render = sorted(set(unmanaged_render))
        # Denied to everyone but their own tenants: every AMD GPU's render node.
        managed = {m for m in self.render_minors.values() if m is not None}
        self._amd_nodes = sorted(managed | set(self.unmanaged_render))
        self.active = False
        self.reason = "[gpu] device_isolation = off" if mode == OFF else "not probed yet"

    def probe(self, tree_root: str) -> None:
        """Decide :attr:`active`: attach a program to a scratch cgroup under ``tree_root``.

        ``tree_root``: krexd's cgroup v2 directory (``<root>/<name>``), which
        exists.  Raises ConfigError (krexd does not start) when ``mode`` is
        ``require`` and isolation cannot be had; under ``auto`` logs a warning.
        """
        if self.mode == OFF:
            return
        unknown = sorted(g for g, m in {**self.minors, **self.render_minors}.items() if m is None)
        why: str | None
        if unknown:
            why = "device minor unknown for " + ", ".join(f"gpu{g}" for g in unknown)
        else:
            why = _try_attach(os.path.join(tree_root, PROBE_DIR))
        if why is None:
            self.active, self.reason = True, ""
            _log.info("device isolation active: each tenant may open only its GPU's node")
            return
        self.reason = why
        if self.mode == REQUIRE:
            raise ConfigError(
                f"[gpu] device_isolation = require, but device isolation is unavailable: {why}"
            )
        _log.warning("device isolation unavailable (%s): tenants are bound by environment", why)

    def confine_tenant(self, directory: str, gpu: int) -> None:
        """Attach the program of GPU ``gpu`` to the new tenant cgroup ``directory``.

        Nothing when inactive.  Raises CgroupError when the attachment fails
        (the caller removes the directory: a tenant is never run unconfined
        while isolation is active).
        """
        if not self.active:
            return
        if gpu in self.render_minors:
            self._confine(directory, None, render_own=self.render_minors[gpu])
        else:
            self._confine(directory, self.minors[gpu], render_deny=self._amd_nodes)

    def confine_pool(self, directory: str) -> None:
        """Attach the program that denies every GPU node to the pool cgroup ``directory``."""
        if self.active:
            self._confine(directory, None, render_deny=self._amd_nodes)

    @staticmethod
    def _confine(
        directory: str,
        minor: int | None,
        render_own: int | None = None,
        render_deny: list[int] | None = None,
    ) -> None:
        try:
            bpf.confine(directory, minor, render_own, render_deny or ())
        except OSError as exc:
            raise CgroupError(
                exc.errno, f"device isolation of {directory}: {exc.strerror or exc}"
            ) from None

    def describe(self) -> dict[str, object]:
        """For ``krexctl status``: ``{"mode", "active", "reason", "minors"[, "render_minors"]}``
        (``reason``: why inactive, "" when active; ``minors``: NVIDIA GPU index -> minor,
        ``render_minors``: AMD GPU index -> render node minor, only when there are any)."""
        out: dict[str, object] = {
            "mode": self.mode,
            "active": self.active,
            "reason": self.reason,
            "minors": {str(g): m for g, m in sorted(self.minors.items())},
        }
        if self.render_minors:
            out["render_minors"] = {str(g): m for g, m in sorted(self.render_minors.items())}
        if self.unmanaged_render:
            out["unmanaged_render"] = list(self.unmanaged_render)
        return out


def _try_attach(scratch: str) -> str | None:
    """Make ``scratch``, attach a program to it, remove it; None, or why it failed."""
    try:
        fs.rmdir(scratch)  # left by a krexd killed mid-probe
        fs.mkdir(scratch)
    except CgroupError as exc:
        return str(exc.strerror)
    try:
        bpf.confine(scratch, None)
    except OSError as exc:
        return str(exc.strerror or exc)
    finally:
        try:
            fs.rmdir(scratch)
        except CgroupError as exc:
            _log.warning("%s", exc)
    return None
