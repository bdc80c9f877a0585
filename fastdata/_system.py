"""What this process may really use: CPUs and memory, honouring cgroups and affinity."""

from __future__ import annotations

import math
import os
from pathlib import Path

_CGROUP = Path("/sys/fs/cgroup")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cgroup_cpu_limit() -> float | None:
    """CPUs allowed by a cgroup quota (v2 ``cpu.max`` or v1 ``cfs_quota_us``), if any."""
    v2 = _read(_CGROUP / "cpu.max")
    if v2:
        quota, _, period = v2.partition(" ")
        if quota != "max" and period:
            return int(quota) / int(period)
        return None
    quota_v1 = _read(_CGROUP / "cpu" / "cpu.cfs_quota_us")
    period_v1 = _read(_CGROUP / "cpu" / "cpu.cfs_period_us")
    if quota_v1 and period_v1 and int(quota_v1) > 0:
        return int(quota_v1) / int(period_v1)
    return None


def usable_cpus() -> int:
    """Number of CPUs this process can use: affinity mask, capped by any cgroup quota."""
    try:
        count = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        count = os.cpu_count() or 1
    limit = _cgroup_cpu_limit()
    if limit is not None:
        count = min(count, max(1, math.floor(limit)))
    return max(1, count)


def _meminfo_available_bytes() -> int | None:
    text = _read(Path("/proc/meminfo"))
    if not text:
        return None
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) * 1024
    return None


def _cgroup_memory_headroom_bytes() -> int | None:
    """Bytes left under a cgroup memory limit (v2 or v1), if one is set."""
    for limit_file, usage_file in (
        (_CGROUP / "memory.max", _CGROUP / "memory.current"),
        (
            _CGROUP / "memory" / "memory.limit_in_bytes",
            _CGROUP / "memory" / "memory.usage_in_bytes",
        ),
    ):
        limit, usage = _read(limit_file), _read(usage_file)
        if limit and usage and limit != "max":
            limit_bytes = int(limit)
            if limit_bytes < 1 << 60:  # v1 reports "no limit" as a huge number
                return max(0, limit_bytes - int(usage))
    return None


def available_memory_bytes() -> int:
    """Memory this process can still allocate: the smaller of MemAvailable and cgroup headroom."""
    candidates = [v for v in (_meminfo_available_bytes(), _cgroup_memory_headroom_bytes()) if v]
    if not candidates:
        pages = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        return int(pages)
    return min(candidates)


def format_bytes(num_bytes: float) -> str:
    """Human-readable binary size, e.g. ``1.5 GiB``."""
    if abs(num_bytes) < 1024:
        return f"{num_bytes:.0f} B"
    value = float(num_bytes)
    for unit in ("KiB", "MiB", "GiB"):
        value /= 1024
        if abs(value) < 1024:
            return f"{value:.1f} {unit}"
    return f"{value / 1024:.1f} TiB"
