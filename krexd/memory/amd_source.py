"""AMD GPUs' memory and users, read through amdsmi: the NVML source's counterpart.

``amdsmi`` is imported only here, when krexd manages AMD GPUs; GPUs are
matched with amdsmi's handles by PCI address, and a GPU no handle matches
makes the source unavailable (krexd then falls back to the shim's counts).
The calls: docs/design/amd.md "Memory and users (amdsmi)".
"""

from __future__ import annotations

import logging
import threading
from typing import Any

from krexd.hardware import kfd
from krexd.hardware.inventory import GpuInfo
from krexd.memory.sources import DeviceMemory
from krexd.system.procfs import pid_alive

_log = logging.getLogger("krexd.memory")


class AmdSmiSource:
    """amdsmi's view of the AMD GPUs ``gpus`` (raises RuntimeError when unavailable)."""

    name = "amdsmi"

    def __init__(self, gpus: list[GpuInfo]) -> None:
        try:
            import amdsmi
        except (ImportError, OSError) as exc:  # not installed, or libamd_smi not found
            raise RuntimeError(f"amdsmi cannot be imported: {exc}") from None
        smi: Any = amdsmi
        try:
            smi.amdsmi_init()
            by_bdf = {
                str(smi.amdsmi_get_gpu_device_bdf(h)).strip().lower(): h
                for h in smi.amdsmi_get_processor_handles()
            }
        except Exception as exc:  # AmdSmiLibraryException: no driver, no permission
            raise RuntimeError(f"amdsmi unavailable: {exc}") from None
        self._smi = smi
        self._handles: dict[int, Any] = {}
        for g in gpus:
            h = by_bdf.get(g.pci_bus_id.lower()) or next(
                (h for b, h in by_bdf.items() if kfd.bus_device(b) == kfd.bus_device(g.pci_bus_id)),
                None,
            )
            if h is None:
                self.close_now()
                raise RuntimeError(f"amdsmi lists no GPU at {g.pci_bus_id} (gpu{g.index})")
            self._handles[g.index] = h
        self._vram = smi.AmdSmiMemoryType.VRAM
        # Reads run in a worker thread; close() must not shut amdsmi down under one.
        self._mu = threading.Lock()
        self._open = True

    def _processes(self, h: Any) -> list[dict[str, Any]]:
        procs: list[dict[str, Any]] = self._smi.amdsmi_get_gpu_process_list(h)
        return procs

    def read(self) -> dict[int, DeviceMemory]:
        """GPU index -> amdsmi's VRAM total, use and per-process use ({} once closed)."""
        with self._mu:
            if not self._open:
                return {}
            out: dict[int, DeviceMemory] = {}
            for index, h in self._handles.items():
                total = int(self._smi.amdsmi_get_gpu_memory_total(h, self._vram))
                used = int(self._smi.amdsmi_get_gpu_memory_usage(h, self._vram))
                per_pid: dict[int, int] = {}
                for p in self._processes(h):
                    pid = int(p["pid"])
                    vram = int((p.get("memory_usage") or {}).get("vram_mem") or 0)
                    per_pid[pid] = per_pid.get(pid, 0) + vram
                out[index] = DeviceMemory(total, used, per_pid, self.name, frozenset(per_pid))
            return out

    def users(self, gpu: int) -> set[int] | None:
        """Live pids with GPU ``gpu`` open (None once closed or for a GPU not its own)."""
        with self._mu:
            h = self._handles.get(gpu) if self._open else None
            if h is None:
                return None
            listed = {int(p["pid"]) for p in self._processes(h)}
        return {p for p in listed if pid_alive(p)}

    def close(self) -> None:
        """Shut amdsmi down (after a read in progress)."""
        with self._mu:
            if self._open:
                self._open = False
                self.close_now()

    def close_now(self) -> None:
        """``amdsmi_shut_down``, errors logged."""
        try:
            self._smi.amdsmi_shut_down()
        except Exception as exc:
            _log.debug("amdsmi_shut_down: %s", exc)
