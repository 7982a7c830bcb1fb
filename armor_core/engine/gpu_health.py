"""GPU health readings: free memory, temperature and uncorrected ECC errors, through NVML or nvidia-smi.

``isolation.check_health`` refuses a plan that puts a worker on a device these readings condemn;
``problems`` says which and why. Nothing here imports torch or touches a device beyond reading it.
"""

from __future__ import annotations

import math
import shutil
import subprocess
from typing import Any, Iterable, Mapping, Sequence

__all__ = ["device_health", "parse_nvidia_smi", "problems"]

_SMI_FIELDS = "index,uuid,name,memory.free,memory.total,temperature.gpu,ecc.errors.uncorrected.volatile.total"


def _num(text: str) -> float | None:
    try:
        v = float(text.strip())
    except ValueError:  # "[N/A]", "[Not Supported]"
        return None
    return v if math.isfinite(v) else None


def parse_nvidia_smi(text: str) -> list[dict[str, Any]]:
    """Rows of ``nvidia-smi --query-gpu=<_SMI_FIELDS> --format=csv,noheader,nounits``."""
    out = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 7:
            continue
        ecc = _num(parts[6])
        out.append(
            {
                "index": int(parts[0]),
                "uuid": parts[1],
                "name": parts[2],
                "memory_free_mib": _num(parts[3]),
                "memory_total_mib": _num(parts[4]),
                "temperature_c": _num(parts[5]),
                "ecc_uncorrected": None if ecc is None else int(ecc),
                "source": "nvidia-smi",
            }
        )
    return out


def _nvml_health(nv: Any) -> list[dict[str, Any]]:
    def get(fn: Any, *args: Any) -> Any:
        try:
            out = fn(*args)
        except nv.NVMLError:  # not supported on this device (ECC on consumer cards, ...)
            return None
        return out.decode() if isinstance(out, bytes) else out  # older pynvml returns bytes

    nv.nvmlInit()
    try:
        rows = []
        for i in range(nv.nvmlDeviceGetCount()):
            h = nv.nvmlDeviceGetHandleByIndex(i)
            mem = get(nv.nvmlDeviceGetMemoryInfo, h)
            rows.append(
                {
                    "index": i,
                    "uuid": get(nv.nvmlDeviceGetUUID, h),
                    "name": get(nv.nvmlDeviceGetName, h),
                    "memory_free_mib": None if mem is None else mem.free / 2**20,
                    "memory_total_mib": None if mem is None else mem.total / 2**20,
                    "temperature_c": get(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU),
                    "ecc_uncorrected": get(
                        nv.nvmlDeviceGetTotalEccErrors, h, nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED, nv.NVML_VOLATILE_ECC
                    ),
                    "source": "nvml",
                }
            )
        return rows
    finally:
        nv.nvmlShutdown()


def device_health() -> list[dict[str, Any]]:
    """Free memory, temperature and uncorrected ECC errors of every GPU of this machine; ``[]`` without GPUs.

    Through NVML (``pynvml``) when importable, else ``nvidia-smi``; neither (a CPU-only machine) or
    a failing one gives ``[]``. Entries are physical devices (NVML order, with UUIDs), not the
    CUDA ordinals of a mask; a value the device does not report is None.
    """
    try:
        import pynvml  # type: ignore[import-not-found]

        return _nvml_health(pynvml)
    except Exception:  # not installed, or no driver: nvidia-smi says the same or nothing
        pass
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return []
    try:
        res = subprocess.run(
            [smi, f"--query-gpu={_SMI_FIELDS}", "--format=csv,noheader,nounits"],
            capture_output=True,
            text=True,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_nvidia_smi(res.stdout) if res.returncode == 0 else []


def _health_of(gpu: str, health: Sequence[Mapping[str, Any]]) -> Mapping[str, Any] | None:
    # a mask entry is a UUID ("GPU-8f3...", possibly abbreviated) or an index; MIG ids are not matched
    for h in health:
        uuid = str(h.get("uuid") or "")
        if (gpu.startswith("GPU-") and uuid.startswith(gpu)) or (gpu.isdigit() and int(gpu) == h.get("index")):
            return h
    return None


def problems(
    assignments: Iterable[Any],
    health: Sequence[Mapping[str, Any]],
    min_free_mib: float | None,
    max_temperature_c: float | None,
    max_ecc_errors: int | None,
) -> list[str]:
    """One line per worker, device and reading that fails a limit (a None limit is not checked)."""
    found = []
    for a in assignments:
        for gpu in a.gpus:
            h = _health_of(gpu, health)
            if h is None:
                continue
            dev = f"{a.name}: GPU {gpu} ({h.get('name')}, {h.get('uuid')})"
            free, temp, ecc = h.get("memory_free_mib"), h.get("temperature_c"), h.get("ecc_uncorrected")
            if min_free_mib is not None and free is not None and free < min_free_mib:
                found.append(
                    f"{dev} has {free:.0f} MiB free, needs >= {min_free_mib:.0f} (another process is using it?)"
                )
            if max_temperature_c is not None and temp is not None and temp > max_temperature_c:
                found.append(f"{dev} is at {temp:.0f} C, limit {max_temperature_c:.0f} C")
            if max_ecc_errors is not None and ecc is not None and ecc > max_ecc_errors:
                found.append(f"{dev} reports {ecc} uncorrected ECC errors since boot, limit {max_ecc_errors}")
    return found
