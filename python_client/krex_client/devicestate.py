"""This command's GPU as its management library sees it: clocks, temperature, power.

Read around each region by the region record and the clock warm-up, through
one interface (:class:`DeviceState`) over NVML (:class:`NvmlState`) or AMD
SMI (:class:`AmdSmiState`), as :func:`vendor` says.  A library that is
missing, a GPU it cannot find, or a figure it cannot give is null, never
guessed (docs/design/region-log.md).  Nothing here runs inside timed code.
"""

from __future__ import annotations

import os
import sys
from typing import Any

SAMPLE_KEYS = ("sm_clock_mhz", "mem_clock_mhz", "temperature_c", "power_w")
VENDORS = ("nvidia", "amd")
VENDOR_ENV = "KREX_GPU_VENDOR"


def vendor(environ: dict[str, str] | None = None) -> str:
    """``"nvidia"`` or ``"amd"``: whose management library describes this command's GPU.

    Args:
        environ: the environment to read (default ``os.environ``).

    Returns:
        ``KREX_GPU_VENDOR`` when it names a vendor; ``"amd"`` when an
        imported PyTorch is a ROCm build or when ``HIP_VISIBLE_DEVICES`` /
        ``ROCR_VISIBLE_DEVICES`` is set without ``CUDA_VISIBLE_DEVICES``;
        else ``"nvidia"``.
    """
    env = os.environ if environ is None else environ
    said = env.get(VENDOR_ENV, "").strip().lower()
    if said in VENDORS:
        return said
    torch = sys.modules.get("torch")
    if getattr(getattr(torch, "version", None), "hip", None):
        return "amd"
    rocm = env.get("HIP_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES")
    if rocm and not env.get("CUDA_VISIBLE_DEVICES"):
        return "amd"
    return "nvidia"


class DeviceState:
    """The state of one GPU; every figure None when its library cannot give it.

    Subclasses set ``lib`` and ``handle`` (both None when unavailable) and
    implement :meth:`_figures`.
    """

    lib: Any = None
    handle: Any = None

    def __init__(self) -> None:
        self._sm_max: int | None = None

    @property
    def available(self) -> bool:
        """Whether the library opened and found the GPU (else every figure is None)."""
        return self.lib is not None

    def _get(self, fn: str, *args: Any) -> Any:
        """``lib.fn(handle, *args)``; None when it raises (not supported on this GPU)."""
        if self.lib is None:
            return None
        try:
            value = getattr(self.lib, fn)(self.handle, *args)
        except Exception:  # noqa: BLE001 - not supported here: null
            return None
        return value.decode() if isinstance(value, bytes) else value

    def device(self) -> dict[str, Any]:
        """``{name, uuid, sm_clock_max_mhz}`` (MHz)."""
        return {**self._identity(), "sm_clock_max_mhz": self.sm_clock_max()}

    def sm_clock_max(self) -> int | None:
        """The SM (AMD: graphics) clock's maximum in MHz, asked once; None when unknown."""
        if self._sm_max is None and self.lib is not None:
            self._sm_max = self._clock_max()
        return self._sm_max

    def sm_clock(self) -> int | None:
        """The SM (AMD: graphics) clock now in MHz; None when it cannot say."""
        return None if self.lib is None else self._clock()

    def sample(self) -> dict[str, Any]:
        """``{sm_clock_mhz, mem_clock_mhz, temperature_c, power_w}`` now."""
        if self.lib is None:
            return dict.fromkeys(SAMPLE_KEYS)
        return self._figures()

    def _identity(self) -> dict[str, Any]:
        raise NotImplementedError

    def _clock(self) -> int | None:
        raise NotImplementedError

    def _clock_max(self) -> int | None:
        raise NotImplementedError

    def _figures(self) -> dict[str, Any]:
        raise NotImplementedError


class NvmlState(DeviceState):
    """An NVIDIA GPU through NVML (``pynvml``, the ``nvidia-ml-py`` package).

    The GPU is ``CUDA_VISIBLE_DEVICES`` when it names a UUID (``GPU-...``, as
    ``krex run`` sets it), else index ``KREX_GPU``.
    """

    def __init__(self, lib: Any = None) -> None:
        """``lib``: the ``pynvml`` module (tests pass a stand-in); imported when None."""
        super().__init__()
        try:
            nv: Any = lib
            if nv is None:
                import pynvml  # type: ignore[import-not-found, unused-ignore]

                nv = pynvml
            nv.nvmlInit()
            visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
            if visible.startswith(("GPU-", "MIG-")):
                self.handle = nv.nvmlDeviceGetHandleByUUID(visible)
            else:
                self.handle = nv.nvmlDeviceGetHandleByIndex(int(os.environ.get("KREX_GPU", "0")))
            self.lib = nv
        except Exception:  # noqa: BLE001 - no pynvml, no driver, no such GPU: all nulls
            self.lib = self.handle = None

    def _identity(self) -> dict[str, Any]:
        return {"name": self._get("nvmlDeviceGetName"), "uuid": self._get("nvmlDeviceGetUUID")}

    def _clock(self) -> int | None:
        return self._get("nvmlDeviceGetClockInfo", self.lib.NVML_CLOCK_SM)  # type: ignore[no-any-return]

    def _clock_max(self) -> int | None:
        return self._get("nvmlDeviceGetMaxClockInfo", self.lib.NVML_CLOCK_SM)  # type: ignore[no-any-return]

    def _figures(self) -> dict[str, Any]:
        nv = self.lib
        power_mw = self._get("nvmlDeviceGetPowerUsage")
        return {
            "sm_clock_mhz": self._clock(),
            "mem_clock_mhz": self._get("nvmlDeviceGetClockInfo", nv.NVML_CLOCK_MEM),
            "temperature_c": self._get("nvmlDeviceGetTemperature", nv.NVML_TEMPERATURE_GPU),
            "power_w": None if power_mw is None else power_mw / 1000.0,
        }


def _bdf(text: str) -> str:
    """A PCI address as ``dddd:bb:dd.f`` lowercase (the domain padded to four digits)."""
    text = text.strip().lower()
    if text.count(":") == 1:
        text = "0000:" + text
    domain, _, rest = text.partition(":")
    return f"{domain[-4:].rjust(4, '0')}:{rest}" if rest else ""


def _same_uuid(a: str, b: str) -> bool:
    """Whether two AMD GPU UUID spellings name one GPU (case, ``GPU-`` and dashes aside)."""

    def norm(s: str) -> str:
        return s.strip().lower().removeprefix("gpu-").replace("-", "")

    return bool(norm(a)) and norm(a) == norm(b)


class AmdSmiState(DeviceState):
    """An AMD GPU through AMD SMI (``amdsmi``, ROCm's management library).

    AMD SMI sees every GPU of the host, whatever the visibility variables
    say, so the GPU is the one at ``KREX_GPU_PCI`` (the PCI address ``krex
    run`` passes), else the one whose UUID ``ROCR_VISIBLE_DEVICES`` names,
    else the host's only GPU when no visibility variable is set; otherwise
    none (an index into a filtered view names no GPU of AMD SMI's list).
    Its "SM clock" is the graphics (GFX) clock, the temperature the hotspot
    (junction) sensor's, else the edge sensor's, and the power the current
    socket power, else the average (W).
    """

    def __init__(self, lib: Any = None) -> None:
        """``lib``: the ``amdsmi`` module (tests pass a stand-in); imported when None."""
        super().__init__()
        try:
            sm: Any = lib
            if sm is None:
                import amdsmi  # type: ignore[import-not-found, unused-ignore]

                sm = amdsmi
            sm.amdsmi_init()
            self.handle = self._pick(sm, sm.amdsmi_get_processor_handles())
            self.lib = sm
        except Exception:  # noqa: BLE001 - no amdsmi, no driver, no such GPU: all nulls
            self.lib = self.handle = None

    @staticmethod
    def _pick(sm: Any, handles: list[Any]) -> Any:
        """The handle of this command's GPU (the class docstring); raises when there is none."""
        pci = _bdf(os.environ.get("KREX_GPU_PCI", ""))
        if pci:
            for h in handles:
                if _bdf(str(sm.amdsmi_get_gpu_device_bdf(h))) == pci:
                    return h
            raise LookupError(f"no AMD GPU at PCI address {pci}")
        rocr = os.environ.get("ROCR_VISIBLE_DEVICES", "").split(",")[0].strip()
        if rocr and not rocr.isdigit():
            for h in handles:
                if _same_uuid(rocr, str(sm.amdsmi_get_gpu_device_uuid(h))):
                    return h
            raise LookupError(f"no AMD GPU with UUID {rocr}")
        if rocr or os.environ.get("HIP_VISIBLE_DEVICES") or len(handles) != 1:
            # An index into a filtered view, or several GPUs and nothing naming one: which of
            # AMD SMI's GPUs it is cannot be known, so none (nulls), never a guess.
            raise LookupError("this command's AMD GPU is not named by its PCI address or UUID")
        return handles[0]

    def _identity(self) -> dict[str, Any]:
        asic = self._get("amdsmi_get_gpu_asic_info")
        name = asic.get("market_name") if isinstance(asic, dict) else None
        return {"name": name, "uuid": self._get("amdsmi_get_gpu_device_uuid")}

    def _clock_of(self, kind: str, key: str) -> int | None:
        info = self._get("amdsmi_get_clock_info", getattr(self.lib.AmdSmiClkType, kind))
        value = info.get(key) if isinstance(info, dict) else None
        return value if isinstance(value, int) else None

    def _clock(self) -> int | None:
        return self._clock_of("GFX", "clk")

    def _clock_max(self) -> int | None:
        return self._clock_of("GFX", "max_clk")

    def _temperature(self) -> int | None:
        sm = self.lib
        for sensor in ("HOTSPOT", "EDGE"):
            t = self._get(
                "amdsmi_get_temp_metric",
                getattr(sm.AmdSmiTemperatureType, sensor),
                sm.AmdSmiTemperatureMetric.CURRENT,
            )
            if isinstance(t, int):
                return t
        return None

    def _power(self) -> float | None:
        info = self._get("amdsmi_get_power_info")
        if not isinstance(info, dict):
            return None
        for key in ("current_socket_power", "average_socket_power"):
            w = info.get(key)
            if isinstance(w, int | float) and w > 0:
                return float(w)
        return None

    def _figures(self) -> dict[str, Any]:
        return {
            "sm_clock_mhz": self._clock(),
            "mem_clock_mhz": self._clock_of("MEM", "clk"),
            "temperature_c": self._temperature(),
            "power_w": self._power(),
        }


def open_state() -> DeviceState:
    """This command's GPU state through its vendor's library (:func:`vendor`)."""
    return AmdSmiState() if vendor() == "amd" else NvmlState()
