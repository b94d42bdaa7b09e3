"""The CPU's description, from /proc/cpuinfo where present (Linux), else from platform."""

from __future__ import annotations

import os
import platform
from functools import lru_cache

from mpcore.core.backend import Device

# Flags that matter for mixed precision speed, shown in the device description.
INTERESTING = frozenset({
    "avx2", "fma", "f16c", "avx512f", "avx512_bf16", "avx512_fp16", "avx512_vnni",
    "amx_tile", "amx_bf16", "amx_fp16", "amx_int8", "asimd", "fphp", "asimdhp", "bf16", "sve",
})


def parse_cpuinfo(text: str) -> tuple[str, str, frozenset[str]]:
    """(model name, vendor, all flags) of the first processor in a /proc/cpuinfo text."""
    name = vendor = ""
    flags: set[str] = set()
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if not sep:
            if name and flags:
                break  # the first processor block is enough
            continue
        key, value = key.strip(), value.strip()
        if key in ("model name", "Model", "cpu model") and not name:
            name = value
        elif key in ("vendor_id", "CPU implementer") and not vendor:
            vendor = value
        elif key in ("flags", "Features") and not flags:
            flags.update(value.split())
    return name, vendor, frozenset(flags)


def isa_level(flags: frozenset[str], machine: str) -> str:
    if "avx512f" in flags:
        return f"{machine} AVX-512"
    if "avx2" in flags:
        return f"{machine} AVX2"
    return machine


@lru_cache(maxsize=1)
def cpu_device() -> Device:
    machine = platform.machine() or "unknown"
    name, vendor, flags = "", "", frozenset()
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            name, vendor, flags = parse_cpuinfo(f.read())
    except OSError:
        pass
    name = name or platform.processor() or machine
    return Device(name=name, vendor=vendor or "unknown", kind="cpu",
                  capability=isa_level(flags, machine), features=flags & INTERESTING,
                  details={"cores": os.cpu_count() or 1})
