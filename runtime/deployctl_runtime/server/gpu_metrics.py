"""NVML gauges of the GPUs this process sees, read at scrape time beside the engine's KV gauges.

Which GPUs: those in ``CUDA_VISIBLE_DEVICES`` (NVML indices, or ``GPU-<uuid>`` entries), all of them when it is
unset, none when it is empty (deployctl sets it to ``hosts[].gpus`` with ``CUDA_DEVICE_ORDER=PCI_BUS_ID``, so CUDA's
and NVML's indices agree, and to empty on cpu). The ``gpu`` label is the NVML index, as dcgm-exporter's ``gpu``.
nvidia-ml-py (``pynvml``) is imported lazily; without it, without a driver or without a visible GPU there are no
GPU series and no error (``open_visible_gpus`` returns None and says why).

Series (prefix ``deployctl_runtime_``; every one labelled ``gpu``), each read where the driver gives it and left
out where NVML answers Not Supported (ECC on consumer GPUs, page retirement after Volta, row remapping before
Ampere): ``gpu_utilization_ratio`` (``nvmlDeviceGetUtilizationRates().gpu`` / 100: the share of the last sample
period a kernel ran), ``gpu_memory_used_bytes`` and ``gpu_memory_total_bytes`` (``nvmlDeviceGetMemoryInfo``: the
whole device, every process), ``gpu_temperature_celsius`` (``NVML_TEMPERATURE_GPU``),
``gpu_ecc_errors_total{type=corrected|uncorrected}`` (``nvmlDeviceGetTotalEccErrors``, volatile: since the driver
loaded), ``gpu_retired_pages_pending`` (1 while a retirement waits for a reset), ``gpu_remapped_rows_pending``
and ``gpu_row_remap_failure`` (``nvmlDeviceGetRemappedRows``), ``gpu_xid_errors_total{xid}`` (critical Xid
events received since this process registered for them, ``nvmlEventTypeXidCriticalError``).
"""
from __future__ import annotations

import logging
import os
from typing import Any, Iterator, Optional

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

PREFIX = "deployctl_runtime_"
log = logging.getLogger("deployctl_runtime.server")


def visible_gpu_entries(value: Optional[str]) -> Optional[list[str]]:
    """CUDA_VISIBLE_DEVICES as entries: None when unset (every GPU), [] when empty. CUDA stops at the first entry
    it cannot parse; so does this (an entry that is neither an index nor a ``GPU-`` UUID ends the list)."""
    if value is None:
        return None
    out = []
    for entry in (e.strip() for e in value.split(",")):
        if not (entry.isdigit() or entry.startswith("GPU-")):
            break
        out.append(entry)
    return out


class NvmlCollector:
    """A prometheus_client collector over NVML handles: ``gpus`` maps the NVML index to its handle; Xid events
    come from one event set per GPU (None where registering failed)."""

    def __init__(self, nvml: Any, gpus: dict[int, Any]):
        self.nvml, self.gpus = nvml, gpus
        self.xids: dict[int, dict[int, int]] = {i: {} for i in gpus}
        self.event_sets: dict[int, Any] = {}
        for index, handle in gpus.items():
            try:
                event_set = nvml.nvmlEventSetCreate()
                nvml.nvmlDeviceRegisterEvents(handle, nvml.nvmlEventTypeXidCriticalError, event_set)
                self.event_sets[index] = event_set
            except Exception as exc:  # NVMLError_NotSupported on some GPUs and in some containers
                log.info("GPU %d: no Xid events from NVML (%s)", index, exc)

    def _read(self, fn: str, *args: Any) -> Any:
        """``pynvml.<fn>(*args)``, or None where the driver does not give it (any NVMLError)."""
        try:
            return getattr(self.nvml, fn)(*args)
        except Exception:
            return None

    def _drain_xids(self, index: int) -> None:
        event_set = self.event_sets.get(index)
        while event_set is not None:
            try:
                data = self.nvml.nvmlEventSetWait_v2(event_set, 0)
            except Exception:  # NVMLError_Timeout: nothing queued
                return
            xid = int(data.eventData)
            self.xids[index][xid] = self.xids[index].get(xid, 0) + 1

    def collect(self) -> Iterator[Any]:
        nv = self.nvml
        fams = {name: GaugeMetricFamily(PREFIX + name, doc, labels=["gpu"]) for name, doc in (
            ("gpu_utilization_ratio", "GPU busy share of NVML's last sample period (0-1)."),
            ("gpu_memory_used_bytes", "GPU memory in use, every process (NVML)."),
            ("gpu_memory_total_bytes", "GPU memory in total (NVML)."),
            ("gpu_temperature_celsius", "GPU core temperature (NVML)."),
            ("gpu_retired_pages_pending", "1 while an ECC page retirement waits for a GPU reset (NVML)."),
            ("gpu_remapped_rows_pending", "1 while a memory row remap waits for a GPU reset (NVML)."),
            ("gpu_row_remap_failure", "1 when a row remap failed: no spare rows left (NVML)."))}
        ecc = CounterMetricFamily(PREFIX + "gpu_ecc_errors", "ECC errors since the driver loaded (NVML, volatile).",
                                  labels=["gpu", "type"])
        xid = CounterMetricFamily(PREFIX + "gpu_xid_errors", "Critical Xid events seen by this process (NVML).",
                                  labels=["gpu", "xid"])
        for index, h in self.gpus.items():
            g = str(index)
            util = self._read("nvmlDeviceGetUtilizationRates", h)
            if util is not None:
                fams["gpu_utilization_ratio"].add_metric([g], float(util.gpu) / 100.0)
            mem = self._read("nvmlDeviceGetMemoryInfo", h)
            if mem is not None:
                fams["gpu_memory_used_bytes"].add_metric([g], float(mem.used))
                fams["gpu_memory_total_bytes"].add_metric([g], float(mem.total))
            temp = self._read("nvmlDeviceGetTemperature", h, nv.NVML_TEMPERATURE_GPU)
            if temp is not None:
                fams["gpu_temperature_celsius"].add_metric([g], float(temp))
            for kind, code in (("corrected", nv.NVML_MEMORY_ERROR_TYPE_CORRECTED),
                               ("uncorrected", nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED)):
                n = self._read("nvmlDeviceGetTotalEccErrors", h, code, nv.NVML_VOLATILE_ECC)
                if n is not None:
                    ecc.add_metric([g, kind], float(n))
            pending = self._read("nvmlDeviceGetRetiredPagesPendingStatus", h)
            if pending is not None:
                fams["gpu_retired_pages_pending"].add_metric([g], float(pending == nv.NVML_FEATURE_ENABLED))
            rows = self._read("nvmlDeviceGetRemappedRows", h)
            if rows is not None:
                fams["gpu_remapped_rows_pending"].add_metric([g], float(bool(rows[2])))
                fams["gpu_row_remap_failure"].add_metric([g], float(bool(rows[3])))
            self._drain_xids(index)
            if index in self.event_sets:
                for code, count in sorted(self.xids[index].items()):
                    xid.add_metric([g, str(code)], float(count))
        yield from (f for f in fams.values() if f.samples)
        yield from (f for f in (ecc, xid) if f.samples)


def open_visible_gpus(environ: Optional[dict] = None) -> tuple[Optional[NvmlCollector], str]:
    """(collector, what it covers) for the GPUs of CUDA_VISIBLE_DEVICES (module doc), or (None, why not). Never
    raises: a missing nvidia-ml-py, driver or GPU means no GPU series."""
    env = os.environ if environ is None else environ
    entries = visible_gpu_entries(env.get("CUDA_VISIBLE_DEVICES"))
    if entries == []:
        return None, "CUDA_VISIBLE_DEVICES is empty"
    try:
        import pynvml
    except ImportError as exc:
        return None, f"nvidia-ml-py (pynvml) is not importable: {exc}"
    try:
        pynvml.nvmlInit()
        if entries is None:
            entries = [str(i) for i in range(pynvml.nvmlDeviceGetCount())]
        gpus = {}
        for entry in entries:
            h = (pynvml.nvmlDeviceGetHandleByIndex(int(entry)) if entry.isdigit()
                 else pynvml.nvmlDeviceGetHandleByUUID(entry))
            gpus[int(pynvml.nvmlDeviceGetIndex(h))] = h
    except Exception as exc:  # NVMLError_LibraryNotFound, _DriverNotLoaded, _GpuIsLost, _NotFound ...
        return None, f"NVML: {exc or type(exc).__name__}"
    if not gpus:
        return None, "NVML sees no GPU"
    return NvmlCollector(pynvml, gpus), "GPU(s) " + ",".join(map(str, sorted(gpus)))


__all__ = ["NvmlCollector", "open_visible_gpus", "visible_gpu_entries"]
