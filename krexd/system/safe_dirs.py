"""krexd's directories must be root's alone: the state directory and the socket's.

krexd, as root, reads its saved state from the state directory (and acts on
what it names: cgroups it kills and removes), keeps its gates and heartbeat
there, and binds its socket in the socket's directory.  A directory another
user may write (a misconfiguration: ``state_dir = "/tmp"``, a directory
created by a user before krexd) lets that user plant a state file or swap
the socket.  :func:`check` makes a missing directory (root's, 0755) and
refuses, with one line (:class:`~krexd.config.config.ConfigError`, exit 78), one
that is not a directory (a symbolic link included), not owned by root, or
writable by others or by a group other than root's.
"""

from __future__ import annotations

import os
import stat

from krexd.config.config import Config, ConfigError


def check_dir(path: str, what: str) -> None:
    """Make ``path`` (root's, 0755) when missing; raise ConfigError unless it is root's alone.

    ``what`` names the setting in the message (e.g. ``"[daemon] state_dir"``).
    """
    try:
        os.makedirs(path, mode=0o755, exist_ok=True)
        st = os.lstat(path)
    except OSError as exc:
        raise ConfigError(f"{what} {path}: {exc.strerror}") from None
    why = ""
    if not stat.S_ISDIR(st.st_mode):
        why = "not a directory"
    elif st.st_uid != 0:
        why = f"owned by uid {st.st_uid}, not root"
    elif st.st_mode & 0o002:
        why = f"writable by every user (mode {stat.S_IMODE(st.st_mode):04o})"
    elif st.st_mode & 0o020 and st.st_gid != 0:
        why = f"writable by group {st.st_gid} (mode {stat.S_IMODE(st.st_mode):04o})"
    if why:
        raise ConfigError(
            f"{what} {path}: {why}; krexd keeps its state and socket only in a directory "
            "that root alone may write"
        )


def check(cfg: Config) -> None:
    """Check the state directory and the socket's directory (:func:`check_dir`)."""
    socket_dir = os.path.dirname(os.path.abspath(cfg.daemon.socket))
    check_dir(socket_dir, "the socket's directory")
    state_dir = cfg.daemon.gate_dir
    if os.path.abspath(state_dir) != socket_dir:
        check_dir(state_dir, "[daemon] state_dir")
