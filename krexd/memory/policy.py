"""The memory side of admission: what a command needs, what a GPU can give, when it waits.

A command's need is reserved on its GPU; it fits where
:meth:`AdmissionPolicy.available` (total - headroom - excess) minus the
needs reserved there holds it, and a GPU where an allocation waits for
co-tenants admits nothing (:meth:`AdmissionPolicy.blocked`).
docs/design/memory.md "2. Admission by memory".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from krex_client.sizes import format_size
from krexd.config.config import MemoryConfig
from krexd.gate import LIVE_REGISTRATION_STATES, Gate, GateError
from krexd.hardware.inventory import GpuInfo
from krexd.memory.learned import LearnedNeeds, label_for
from krexd.memory.views import MemoryViews
from krexd.system.errors import Code, KrexError
from krexd.system.procfs import pid_alive
from krexd.tenancy.admission import GpuSlots
from krexd.tenancy.memory_records import TenantMemory

if TYPE_CHECKING:
    from krexd.tenancy.registration_flags import RegistrationFlags


class PolicyGpu(Protocol):
    """What the policy uses of a GPU (``krexd.orchestration.gpu.Gpu`` shares them)."""

    @property
    def info(self) -> GpuInfo: ...

    @property
    def gate(self) -> Gate | None: ...

    @property
    def slots(self) -> GpuSlots: ...


class AdmissionPolicy:
    """``krexd.tenancy.admission.MemoryPolicy`` over the GPUs' views; the needs of new commands.

    Args:
        cfg: the ``[memory]`` table (admission on/off, headroom, default
            need, learning).
        views: the GPUs' memory views (read; :meth:`refresh` re-reads the
            shim's counts through them).
        gpus: the managed GPUs: their gates (the WAITING bits) and slots (a
            slot's share of the card).
        learned: the learned needs (``krexd.memory.learned``; read).
        flags: which slot-memory waits are honoured (``krexd.tenancy.registration_flags``;
            None: every one of a live process).
    """

    def __init__(
        self,
        cfg: MemoryConfig,
        views: MemoryViews,
        gpus: Sequence[PolicyGpu],
        learned: LearnedNeeds,
        flags: RegistrationFlags | None = None,
    ) -> None:
        self.cfg = cfg
        self._views = views
        self._gpus = {g.info.index: g for g in gpus}
        self._learned = learned
        self._flags = flags

    def need_for(
        self,
        mem_bytes: int | None,
        gpu: int | None,
        argv: list[str],
        label: str | None = None,
        *,
        uid: int,
    ) -> TenantMemory:
        """A new command's record: what admission charges it (bytes), and why.

        The need is max(declared ``mem_bytes``, learned, default): the learned
        need is the largest recent peak of the command's label (``label``, else
        :func:`krexd.memory.learned.label_for` of ``argv``) among the runs of
        ``uid`` (the verified launcher's; never another user's), capped at what the
        largest candidate GPU (``gpu``, else every GPU) can give; the default is
        ``[memory] default_need`` capped at the smallest candidate GPU's share per slot
        (``(total - headroom) / slots``), so that a full GPU of
        undeclared commands always fits.  A declared need no candidate GPU can
        ever hold (more than ``total - headroom``) is refused with
        ``KrexError(BAD_FIELD)`` while admission by memory is on.
        """
        candidates = [gpu] if gpu is not None else list(self._gpus)
        viewed = [g for g in candidates if self._views.view(g) is not None]
        caps = [self.capacity(g) for g in viewed]
        if mem_bytes is not None and self.cfg.admission and caps and mem_bytes > max(caps):
            raise KrexError(
                Code.BAD_FIELD,
                f"mem_bytes: {format_size(mem_bytes)} never fits: "
                f"{'GPU ' + str(gpu) if gpu is not None else 'the largest GPU'} holds "
                f"{format_size(max(0, max(caps)))} after the {format_size(self.cfg.headroom)} "
                "headroom",
            )
        default = self.cfg.default_need
        shares = [max(0, self.capacity(g)) // max(1, self._gpus[g].slots.total) for g in viewed]
        if shares:
            default = min(default, *shares)
        key = label if label else label_for(argv)
        learned = self._learned.need(uid, key) if self.cfg.learn else None
        if learned is not None and caps:
            learned = min(learned, max(0, max(caps)))
        need, source = default, "default"
        if learned is not None and learned > need:
            need, source = learned, "learned"
        if mem_bytes is not None and mem_bytes >= need:
            need, source = mem_bytes, "declared"
        rec = TenantMemory(need, source, label=key, declared_bytes=mem_bytes)
        rec.learned_bytes = learned
        return rec

    def capacity(self, gpu: int) -> int:
        """What GPU ``gpu`` can ever give commands: total - headroom (bytes; the total is 0
        before the first read)."""
        view = self._views.view(gpu)
        total = view.total if view is not None else 0
        return total - self.cfg.headroom

    def blocked(self, gpu: int) -> bool:
        """True while a verified allocation on ``gpu`` waits for co-tenants' memory, within
        its bound (read from the gate now; ``krexd.tenancy.registration_flags``).  False without
        a gate."""
        g = self._gpus.get(gpu)
        if g is None or g.gate is None:
            return False
        try:
            waiting = g.gate.waiting_for_memory()
            if self._flags is not None:
                return self._flags.waits_honoured(g.gate, waiting)
        except GateError:
            return False  # unmapped: the daemon is stopping
        return any(s.state in LIVE_REGISTRATION_STATES and pid_alive(s.pid) for s in waiting)

    def available(self, gpu: int) -> int | None:
        """Bytes of ``gpu`` admission may still reserve, before reservations: total -
        headroom - excess (None: admission by memory off, or no view yet)."""
        view = self._views.view(gpu)
        if not self.cfg.admission or view is None:
            return None
        return view.total - self.cfg.headroom - view.excess

    def refresh(self) -> None:
        """Re-read every GPU's shim counts now (once per admission dispatch)."""
        self._views.refresh()
