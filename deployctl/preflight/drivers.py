"""NVIDIA driver versus the CUDA version a torch build needs (case C14).

Source: NVIDIA CUDA Toolkit Release Notes, Table 3 "CUDA Toolkit and Corresponding Driver Versions"
(https://docs.nvidia.com/cuda/cuda-toolkit-release-notes/index.html#id5), Linux x86_64 "Toolkit Driver
Version" column, GA releases: the minimum driver that supports each CUDA version fully.

Minor-version compatibility (same page, Table 2): CUDA 12.x applications can run on any driver
>= 525.60.13 and 11.x on >= 450.80.02, *with limitations*: no PTX JIT of newer PTX (Triton kernels and
torch.compile emit PTX; "the provided PTX was compiled with an unsupported toolchain") and APIs newer
than the driver return cudaErrorCallRequiresNewerDriver. deployctl does not rely on it: a driver whose
supported CUDA (NVML ``nvmlSystemGetCudaDriverVersion``) is older than torch's CUDA build fails the
check, and the message mentions the compatibility floor so an operator knows why it might still start.
"""
from __future__ import annotations

from typing import Optional

# CUDA major.minor -> minimum Linux x86_64 driver (GA release), from Table 3 cited above.
CUDA_MIN_DRIVER: dict[tuple[int, int], str] = {
    (10, 2): "440.33",
    (11, 0): "450.36.06",
    (11, 1): "455.23",
    (11, 2): "460.27.03",
    (11, 3): "465.19.01",
    (11, 4): "470.42.01",
    (11, 5): "495.29.05",
    (11, 6): "510.39.01",
    (11, 7): "515.43.04",
    (11, 8): "520.61.05",
    (12, 0): "525.60.13",
    (12, 1): "530.30.02",
    (12, 2): "535.54.03",
    (12, 3): "545.23.06",
    (12, 4): "550.54.14",
    (12, 5): "555.42.02",
    (12, 6): "560.28.03",
    (12, 8): "570.26",
    (12, 9): "575.51.03",
    (13, 0): "580.65.06",
}
# Minor-version compatibility floors (Table 2 of the same release notes).
MINOR_COMPAT_MIN_DRIVER = {11: "450.80.02", 12: "525.60.13", 13: "580.65.06"}
SOURCE = 'NVIDIA CUDA Toolkit Release Notes, "CUDA Toolkit and Corresponding Driver Versions"'


def parse_version(text: str) -> tuple[int, ...]:
    """"530.30.02" -> (530, 30, 2); "12.4" -> (12, 4). Raises ValueError on anything else."""
    return tuple(int(part) for part in str(text).strip().split("."))


def cuda_from_nvml(value: int) -> str:
    """NVML's CUDA driver version integer to "major.minor": 12010 -> "12.1", 11040 -> "11.4"."""
    return f"{value // 1000}.{(value % 1000) // 10}"


def cuda_supported_by_driver(driver: str) -> Optional[str]:
    """The highest CUDA major.minor the table says ``driver`` supports, or None if below all."""
    d = parse_version(driver)
    best = None
    for cuda, minimum in CUDA_MIN_DRIVER.items():
        if d >= parse_version(minimum) and (best is None or cuda > best):
            best = cuda
    return f"{best[0]}.{best[1]}" if best else None


def min_driver_for_cuda(cuda: str) -> Optional[str]:
    """Minimum driver for a CUDA "major.minor" (the next listed version's when not listed)."""
    want = parse_version(cuda)[:2]
    for listed in sorted(CUDA_MIN_DRIVER):
        if listed >= want:
            return CUDA_MIN_DRIVER[listed]
    return None


def driver_verdict(driver: str, driver_cuda: Optional[str], torch_cuda: Optional[str]) -> tuple[str, str, Optional[str]]:
    """(status, message, fix) for a driver against a torch CUDA build.

    driver: "530.30.02"; driver_cuda: the driver's CUDA from NVML ("12.1"), or None to use the table;
    torch_cuda: torch.version.cuda of the runtime environment ("12.4"), None for a CPU build.
    A driver version that is not dotted numbers (a vendor build, a stand-in NVML) is a "warn" naming it: the table
    cannot place it, so nothing is claimed about its CUDA support.
    """
    try:
        parse_version(driver)
    except ValueError:
        return ("warn", f"NVIDIA driver version {driver!r} is not dotted numbers (e.g. 570.133.20): cannot tell which "
                        f"CUDA it supports" + (f" (NVML says CUDA {driver_cuda})" if driver_cuda else ""),
                "check `nvidia-smi` on the host; the check compares the driver with the runtime's torch CUDA build "
                "only when the version reads like 570.133.20")
    supported = driver_cuda or cuda_supported_by_driver(driver)
    if torch_cuda is None:
        return "pass", f"driver {driver} supports CUDA up to {supported}; the runtime's torch has no CUDA build to compare", None
    if supported is None:
        return "fail", f"driver {driver} is older than every CUDA release in the table ({SOURCE})", "install a current NVIDIA driver"
    need = parse_version(torch_cuda)[:2]
    if parse_version(supported)[:2] >= need:
        return "pass", f"driver {driver} supports CUDA up to {supported}; torch is built for CUDA {torch_cuda}", None
    minimum = min_driver_for_cuda(torch_cuda)
    compat = MINOR_COMPAT_MIN_DRIVER.get(need[0])
    note = ""
    if compat and parse_version(driver) >= parse_version(compat) and parse_version(supported)[0] == need[0]:
        note = (f" (CUDA minor-version compatibility from driver {compat} may let it start, but PTX JIT — Triton, "
                f"torch.compile — and newer CUDA APIs fail on it, so deployctl requires full support)")
    message = (f"NVIDIA driver {driver} supports CUDA up to {supported}, but the runtime's torch is built for "
               f"CUDA {torch_cuda}{note}")
    fix = (f"install NVIDIA driver >= {minimum} (CUDA {torch_cuda}, per {SOURCE}), or install a torch build for "
           f"CUDA <= {supported} in the runtime environment")
    return "fail", message, fix
