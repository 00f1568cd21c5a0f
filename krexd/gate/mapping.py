"""The gate file and krexd's mapping of it: create, open again, unmap, unlink, relink.

``GateMapping`` holds the handle of ``libkrex_gate.so`` and keeps it alive
while calls are in progress in other threads (``drain`` runs in worker
threads); ``krexd.gate.Gate`` builds the protocol on it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Self

from krexd.gate.binding import ABI_VERSION, library
from krexd.gate.errors import GateError
from krexd.gate.readback import Judge

#: Mode of the gate file: krexd (root) writes it, everyone may map it read-only.
GATE_MODE = 0o644


def keep_path(path: str) -> str:
    """The gate's second link for ``path``: ``.krex-keep/<name>`` beside it (root's, 0700)."""
    return os.path.join(os.path.dirname(path), ".krex-keep", os.path.basename(path))


class GateMapping:
    """One gate file as krexd maps it (read-write).  Build with :meth:`create` or :meth:`open`.

    ``judge`` (None: none) verifies the owners of registrations still pending
    in a drain (``krexd.gate.Gate.drain``; krexd's is
    ``krexd.tenancy.registrations.Verifier.judge``).
    """

    def __init__(
        self, path: str, handle: int, keep: str | None = None, judge: Judge | None = None
    ) -> None:
        self.path = path
        self.keep = keep
        self.judge = judge
        self._h: int | None = handle
        self._lib = library()
        # Calls in progress (drain runs in worker threads): the mapping is
        # dropped only when the last one returns.
        self._users = 0
        self._unmap_pending = False
        self._mu = threading.Lock()
        self._attached: set[int] = set()  # tenants whose slot memory is attached

    # -- construction -----------------------------------------------------

    @classmethod
    def create(
        cls,
        path: str,
        gpu: int,
        mode: int = GATE_MODE,
        keep: str | None = None,
        judge: Judge | None = None,
    ) -> Self:
        """Build a fresh, open gate for GPU ``gpu`` at ``path`` and map it.

        ``mode`` is the file mode, applied exactly (the umask is ignored;
        0o644: tenants map it read-only, and the shim refuses a gate that
        is not root's or that others may write).  The file's space is
        reserved before it is used: a full file system raises GateError
        (ENOSPC) here.  It is built beside ``path`` and renamed over it, so
        processes still mapping a previous gate keep their own copy;
        ``keep`` is a second link (in a directory only root writes) from
        which :meth:`relink` restores ``path``; ``judge``: the drain's judge
        of pending owners (class docstring).
        """
        if not 0 <= gpu <= 0xFFFF_FFFF:
            raise ValueError(f"gpu must be a GPU index, not {gpu}")
        if mode & ~0o7777:
            raise ValueError(f"mode must be a permission mode, not {oct(mode)}")
        lib = library()
        h = lib.krex_coord_create(os.fsencode(path), os.fsencode(keep) if keep else None, gpu, mode)
        if not h:
            err = ctypes.get_errno()
            raise GateError(f"cannot create gate {path}: {os.strerror(err)}", err)
        return cls(path, h, keep, judge)

    @classmethod
    def open(
        cls, path: str, gpu: int | None, keep: str | None = None, judge: Judge | None = None
    ) -> Self:
        """Map the gate a krexd made before a restart again, read-write (adoption).

        The tenants' shims keep mapping this very file, so a restarted krexd
        writes the same one (never a new one).  Opened from ``keep`` when it
        exists (a directory only root writes), else ``path``; it must be a
        regular file of krexd's user that nobody else may write, of this
        layout version and for GPU ``gpu`` (None: any, for the watchdog,
        which only reopens it).  No slot memory is attached
        (adoption attaches each tenant's again, :meth:`attach`) and
        :attr:`epoch` is the one the gate word holds (seed it:
        :meth:`set_epoch`).  ``judge``: the drain's judge of pending owners
        (class docstring).  Raises GateError (EPERM: not a file krexd
        made; EPROTO: another layout version or GPU).
        """
        lib = library()
        want = 0xFFFF_FFFF if gpu is None else gpu
        h = lib.krex_coord_open(os.fsencode(path), os.fsencode(keep) if keep else None, want)
        if not h:
            err = ctypes.get_errno()
            why = os.strerror(err)
            if err == errno.EPERM:
                why = "not root's, or writable by others: not a gate krexd made"
            elif err == errno.EPROTO:
                version = ctypes.c_uint32(0)
                rc = lib.krex_gate_file_version(os.fsencode(path), ctypes.byref(version))
                why = (
                    f"gate layout version {version.value} (this krexd expects {ABI_VERSION}), "
                    f"or not the gate of GPU {gpu}"
                    if rc == 0
                    else "not a krex gate"
                )
            raise GateError(f"cannot open gate {path}: {why}", err)
        gate = cls(path, h, keep, judge)
        if keep:
            gate.relink()  # `path` names this file again if it was removed or replaced
        return gate

    @contextmanager
    def _mapped(self) -> Iterator[int]:
        """The handle, kept alive for the duration of the block."""
        with self._mu:
            if self._h is None or self._unmap_pending:
                raise GateError(f"gate {self.path} is unmapped")
            self._users += 1
            h = self._h
        try:
            yield h
        finally:
            with self._mu:
                self._users -= 1
                if self._unmap_pending and self._users == 0:
                    self._drop()

    def _drop(self) -> None:
        if self._h is not None:
            self._lib.krex_coord_destroy(self._h)
            self._h = None

    def unmap(self) -> None:
        """Drop the mappings and fds (the files stay); further calls raise GateError.

        A call still running in another thread keeps them until it returns.
        """
        with self._mu:
            self._unmap_pending = True
            if self._users == 0:
                self._drop()

    def unlink(self) -> None:
        """Remove the gate file (and its second link); the mapping stays usable."""
        for name in (self.path, self.keep):
            if name:
                try:
                    os.unlink(name)
                except FileNotFoundError:
                    pass

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.unmap()

    def relink(self) -> bool:
        """Make ``path`` name this gate again if it was removed or replaced.

        Returns True when it had to be restored.  Raises GateError when it
        cannot be (no second link).
        """
        with self._mapped() as h:
            rc = int(
                self._lib.krex_coord_relink(
                    h, os.fsencode(self.path), os.fsencode(self.keep) if self.keep else None
                )
            )
        if rc < 0:
            raise GateError(f"cannot restore gate {self.path}: {os.strerror(-rc)}", -rc)
        return rc == 0
