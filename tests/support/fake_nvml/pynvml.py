"""A stand-in for nvidia-ml-py's ``pynvml`` that answers from recorded NVML facts (no GPU here).

Put this directory first on PYTHONPATH (or sys.path) and set ``DEPLOYCTL_TEST_NVML_FACTS`` to a JSON file in the
shape of tests/data/nvml/*.json; the file is read on every call, so a test can change the answers between two
scrapes. Only the calls deployctl's probe and the runtime's GPU gauges make exist; their names, constants,
return shapes and error codes are nvidia-ml-py's (pynvml.py of nvidia-ml-py 12.x). A recorded ``null`` means the
driver answers Not Supported; a GPU with ``"lost": true`` answers GPU is lost (NVML_ERROR_GPU_IS_LOST) as a GPU
that fell off the bus does.
"""
from __future__ import annotations

import json
import os
from types import SimpleNamespace

NVML_FEATURE_DISABLED, NVML_FEATURE_ENABLED = 0, 1
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 0, 1
NVML_VOLATILE_ECC, NVML_AGGREGATE_ECC = 0, 1
NVML_ERROR_UNINITIALIZED = 1
NVML_ERROR_NOT_SUPPORTED = 3
NVML_ERROR_NOT_FOUND = 6
NVML_ERROR_DRIVER_NOT_LOADED = 9
NVML_ERROR_TIMEOUT = 10
NVML_ERROR_LIBRARY_NOT_FOUND = 12
NVML_ERROR_GPU_IS_LOST = 15
nvmlEventTypeXidCriticalError = 0x0000000000000008

_TEXT = {1: "Uninitialized", 3: "Not Supported", 6: "Not Found", 9: "Driver Not Loaded", 10: "Timeout",
         12: "NVML Shared Library Not Found", 15: "GPU is lost"}


class NVMLError(Exception):
    def __init__(self, value: int):
        super().__init__(value)
        self.value = value

    def __str__(self) -> str:
        return _TEXT.get(self.value, "NVML Error with code %d" % self.value)


def _facts() -> dict:
    with open(os.environ["DEPLOYCTL_TEST_NVML_FACTS"]) as f:
        return json.load(f)


_state = {"init": False}


def nvmlInit() -> None:
    err = _facts().get("init_error")
    if err:
        raise NVMLError(err)
    _state["init"] = True


def nvmlShutdown() -> None:
    _state["init"] = False


def _gpus() -> list:
    if not _state["init"]:
        raise NVMLError(NVML_ERROR_UNINITIALIZED)
    return _facts()["gpus"]


def _gpu(handle: int) -> dict:
    gpu = _gpus()[handle]
    if gpu.get("lost"):
        raise NVMLError(NVML_ERROR_GPU_IS_LOST)
    return gpu


def _field(handle: int, key: str):
    value = _gpu(handle).get(key)
    if value is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    return value


def nvmlSystemGetDriverVersion() -> str:
    return _facts()["driver_version"]


def nvmlSystemGetCudaDriverVersion() -> int:
    return _facts()["cuda_driver_version"]


def nvmlDeviceGetCount() -> int:
    return len(_gpus())


def nvmlDeviceGetHandleByIndex(index: int) -> int:
    gpus = _gpus()
    if not 0 <= index < len(gpus):
        raise NVMLError(NVML_ERROR_NOT_FOUND)
    _gpu(index)
    return index


def nvmlDeviceGetHandleByUUID(uuid) -> int:
    uuid = uuid.decode() if isinstance(uuid, bytes) else uuid
    for index, gpu in enumerate(_gpus()):
        if gpu.get("uuid") == uuid:
            return nvmlDeviceGetHandleByIndex(index)
    raise NVMLError(NVML_ERROR_NOT_FOUND)


def nvmlDeviceGetIndex(handle: int) -> int:
    _gpu(handle)
    return handle


def nvmlDeviceGetName(handle: int) -> str:
    return _field(handle, "name")


def nvmlDeviceGetUUID(handle: int) -> str:
    return _field(handle, "uuid")


def nvmlDeviceGetPciInfo(handle: int):
    """nvmlPciInfo_t's fields from the recorded ``pci_bus_id`` ("00000000:18:00.0"): busId (str, as nvidia-ml-py's
    _PrintableStructure decodes it), busIdLegacy ("0000:18:00.0"), domain, bus, device."""
    bus_id = _field(handle, "pci_bus_id")
    domain, bus, rest = bus_id.split(":")
    return SimpleNamespace(busId=bus_id, busIdLegacy="%04x:%s:%s" % (int(domain, 16), bus, rest),
                           domain=int(domain, 16), bus=int(bus, 16), device=int(rest.split(".")[0], 16),
                           pciDeviceId=0x233010DE, pciSubSystemId=0x16C110DE)


def nvmlDeviceGetMemoryInfo(handle: int):
    return SimpleNamespace(**_field(handle, "memory"))


def nvmlDeviceGetCudaComputeCapability(handle: int) -> tuple:
    return tuple(_field(handle, "compute_capability"))


def nvmlDeviceGetUtilizationRates(handle: int):
    return SimpleNamespace(**_field(handle, "utilization"))


def nvmlDeviceGetTemperature(handle: int, sensor: int) -> int:
    return _field(handle, "temperature_gpu")


def nvmlDeviceGetTotalEccErrors(handle: int, error_type: int, counter_type: int) -> int:
    counts = _field(handle, "ecc_volatile" if counter_type == NVML_VOLATILE_ECC else "ecc_aggregate")
    return counts["uncorrected" if error_type == NVML_MEMORY_ERROR_TYPE_UNCORRECTED else "corrected"]


def nvmlDeviceGetRetiredPagesPendingStatus(handle: int) -> int:
    return NVML_FEATURE_ENABLED if _field(handle, "retired_pages_pending") else NVML_FEATURE_DISABLED


def nvmlDeviceGetRemappedRows(handle: int) -> tuple:
    return tuple(_field(handle, "remapped_rows"))


def nvmlDeviceGetComputeRunningProcesses(handle: int) -> list:
    return [SimpleNamespace(**p) for p in _gpu(handle).get("processes") or []]


def nvmlDeviceGetGraphicsRunningProcesses(handle: int) -> list:
    return []


def nvmlEventSetCreate() -> dict:
    return {"handles": [], "seen": {}}


def nvmlDeviceRegisterEvents(handle: int, event_types: int, event_set: dict) -> None:
    if _gpu(handle).get("xid_events") is None:
        raise NVMLError(NVML_ERROR_NOT_SUPPORTED)
    event_set["handles"].append(handle)


def nvmlEventSetWait_v2(event_set: dict, timeout_ms: int):
    for handle in event_set["handles"]:
        events = _gpu(handle).get("xid_events") or []
        seen = event_set["seen"].get(handle, 0)
        if seen < len(events):
            event_set["seen"][handle] = seen + 1
            return SimpleNamespace(device=handle, eventType=nvmlEventTypeXidCriticalError, eventData=events[seen],
                                   gpuInstanceId=0xFFFFFFFF, computeInstanceId=0xFFFFFFFF)
    raise NVMLError(NVML_ERROR_TIMEOUT)


def nvmlEventSetWait(event_set: dict, timeout_ms: int):
    return nvmlEventSetWait_v2(event_set, timeout_ms)
