"""How many commands a GPU admits at once (its slots): ``[admission] slots_per_gpu``.

``"auto"`` (the shipped default) derives each GPU's count::

    slots = clamp(1, min(floor(tenant_cores * K) within [AUTO_MIN, AUTO_MAX],
                         floor((total_mem - headroom) / default_need)))

and a fixed integer overrides it.  Why these terms and this ``K``, with the
measurements: docs/design/daemon.md "Admission".
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from krex_client.sizes import format_size

AUTO = "auto"
#: Slots per tenant core (the measurements behind it: docs/design/daemon.md "Admission").
SLOTS_PER_CORE = 1.0
#: The most slots the CPU term gives one GPU.
AUTO_MAX = 64
#: The fewest the CPU term gives (the fixed default of earlier versions).
AUTO_MIN = 4


@dataclass(frozen=True)
class SlotChoice:
    """A GPU's slot count: ``total`` slots, ``mode`` "auto" or "fixed", ``rule`` (one line)."""

    total: int
    mode: str
    rule: str

    def as_dict(self) -> dict[str, Any]:
        """JSON-ready form (``gpus[].slots`` of ``status``)."""
        return {"total": self.total, "mode": self.mode, "rule": self.rule}


def choose(
    setting: int | str, tenant_cores: int, total_mem: int, default_need: int, headroom: int
) -> SlotChoice:
    """One GPU's slots for ``[admission] slots_per_gpu`` = ``setting``.

    Args:
        setting: ``"auto"`` or a fixed count (>= 1, already checked by the config).
        tenant_cores: number of the GPU's tenant cores (``CpuSlice.tenant_cores``).
        total_mem: the GPU's memory (bytes; 0 when unknown: the memory term is skipped).
        default_need: ``[memory] default_need`` (bytes; 0: the memory term is skipped).
        headroom: ``[memory] headroom`` (bytes).

    Returns:
        The :class:`SlotChoice`: a fixed ``setting`` as is; "auto" in [1, AUTO_MAX].
    """
    if setting != AUTO:
        n = int(setting)
        return SlotChoice(n, "fixed", f"fixed: {n} ([admission] slots_per_gpu = {n})")
    raw = int(max(0, tenant_cores) * SLOTS_PER_CORE)
    cpu = min(max(raw, AUTO_MIN), AUTO_MAX)
    cpu_text = f"cores {tenant_cores} x {SLOTS_PER_CORE:g}"
    if raw > AUTO_MAX:
        cpu_text += f" capped at {AUTO_MAX}"
    elif raw < AUTO_MIN:
        cpu_text += f" raised to {AUTO_MIN}"
    terms = [cpu]
    texts = [cpu_text]
    if total_mem > 0 and default_need > 0:
        usable = max(0, total_mem - headroom)
        terms.append(usable // default_need)
        texts.append(f"memory {format_size(usable)} / {format_size(default_need)}")
    n = max(1, min(terms))
    rule = f"auto: {n} = min({', '.join(texts)})"
    if min(terms) < 1:
        rule += ", at least 1"
    return SlotChoice(n, "auto", rule)


def check_setting(value: Any) -> int | str:
    """The config checker of ``slots_per_gpu``: ``"auto"`` or an integer in [1, 1024].

    Raises:
        ValueError: anything else (one line, naming what is allowed).
    """
    if value == AUTO:
        return AUTO
    if isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= 1024:
        return value
    raise ValueError(f'must be "auto" or an integer in [1, 1024], got {value!r}')
