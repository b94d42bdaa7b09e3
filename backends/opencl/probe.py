"""The kernel probe: build and run mpcore's OpenCL kernels on a device in a subprocess, before
the process that wants them builds them itself.

Why a subprocess: a driver's compiler can abort the process that calls it. PoCL 3.0 (LLVM 14)
on an AMD Zen 4 reports 16-wide float vectors but compiles for ``znver3`` without AVX-512, and
LLVM then stops with ``Cannot select ... _cl_madDv16_f`` (SIGABRT) at the first 16-wide GEMM;
no exception handler can catch that. So :func:`probe` runs ``python -m mpcore_opencl.smoke``
once per candidate GEMM vector width (:func:`mpcore_opencl.tiling.candidate_widths`, from what
the device reports down to 1), each with a deadline, until one builds every program of a small
smoke test (GEMMs of both variants in float32 and 16-bit storage, native half where the device
has it, elementwise ops, a reduction, softmax, loss scaling and an optimizer update) and
computes correctly. The backend then uses that width, and its own builds of the same programs
hit the driver's cache.

A result that found a working width is cached on disk, keyed by the device, its driver and the
kernel sources, so a process pays for the probe once per machine and driver (about a second with
a warm driver cache; several seconds when PoCL compiles from scratch). A device where no width
works raises :class:`~mpcore.KernelBuildError` at activation, naming each attempt's outcome;
that is not cached, so a transient failure (a machine out of memory) is tried again next time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from importlib import metadata, resources
from typing import Any

from mpcore.core.backend import Device

from .tiling import VECTOR_WIDTHS, candidate_widths

#: Seconds one attempt (a subprocess building about fifteen programs) may take.
ATTEMPT_TIMEOUT_S = 300.0
#: The environment variable that fixes the GEMM vector width (no probe); the probe's children
#: run with it.
WIDTH_ENV = "MPCORE_OPENCL_VECTOR_WIDTH"
#: Bumped when the smoke test changes, so that cached results are redone.
PROBE_VERSION = 1


def fixed_width() -> int | None:
    """The GEMM vector width ``MPCORE_OPENCL_VECTOR_WIDTH`` fixes, or None (unset: probe)."""
    raw = os.environ.get(WIDTH_ENV, "").strip()
    if not raw:
        return None
    if raw not in {str(w) for w in VECTOR_WIDTHS}:
        raise ValueError(f"{WIDTH_ENV}={raw!r} is not valid; valid values: "
                         + ", ".join(map(str, VECTOR_WIDTHS))
                         + " (or unset, and the kernel probe chooses)")
    return int(raw)


@dataclass(frozen=True)
class Attempt:
    """One subprocess run at one vector width: ``outcome`` is "ok", "crashed", "failed" or
    "timed out"; ``detail`` says what went wrong (the driver's last words for a crash)."""

    width: int
    outcome: str
    detail: str = ""
    seconds: float = 0.0

    def __str__(self) -> str:
        text = f"width {self.width}: {self.outcome}"
        return f"{text} ({self.detail})" if self.detail else text


@dataclass(frozen=True)
class ProbeResult:
    """What the probe found on one device: the widest GEMM vector width that worked (None if
    none did) and every attempt, widest first."""

    device: str
    vector_width: int | None
    attempts: tuple[Attempt, ...]
    cached: bool = False

    @property
    def ok(self) -> bool:
        return self.vector_width is not None

    def summary(self) -> str:
        tried = "; ".join(str(a) for a in self.attempts) or "nothing tried"
        if self.ok:
            return f"GEMM vector width {self.vector_width} verified on {self.device} ({tried})"
        return f"no GEMM vector width works on {self.device}: {tried}"

    def to_json(self) -> dict[str, Any]:
        return {"device": self.device, "vector_width": self.vector_width,
                "attempts": [asdict(a) for a in self.attempts]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ProbeResult:
        return cls(str(data["device"]), data["vector_width"],
                   tuple(Attempt(**a) for a in data["attempts"]), cached=True)


def classify(width: int, returncode: int | None, stdout: str, stderr: str,
             seconds: float = 0.0) -> Attempt:
    """The outcome of one attempt from its exit status (None: it ran past its deadline) and
    output (the child prints one JSON line last)."""
    if returncode is None:
        return Attempt(width, "timed out", f"no answer within {seconds:.0f} s", seconds)
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return Attempt(width, "crashed", f"{name}: {_last_words(stderr)}", seconds)
    report = _report(stdout)
    if returncode == 0 and report is not None and report.get("ok"):
        return Attempt(width, "ok", "", seconds)
    if report is not None and report.get("problems"):
        return Attempt(width, "failed", "; ".join(report["problems"])[:2000], seconds)
    return Attempt(width, "failed", f"exit status {returncode}: {_last_words(stderr)}", seconds)


def _report(stdout: str) -> dict[str, Any] | None:
    for line in reversed(stdout.strip().splitlines()):
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict):
            return data
    return None


def _last_words(stderr: str, lines: int = 3) -> str:
    """The lines of a dying process's stderr that say why: its ERROR lines (LLVM's "LLVM
    ERROR: ..."), else its last lines."""
    text = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    errors = [line for line in text if "error" in line.lower()]
    chosen = errors[-lines:] if errors else text[-lines:]
    return " | ".join(chosen)[:1000] or "nothing on stderr"


def run_attempt(index: str, width: int, timeout: float = ATTEMPT_TIMEOUT_S) -> Attempt:
    """Run the smoke test on OpenCL device ``index`` ("platform:device") at GEMM vector width
    ``width`` in a subprocess, with a deadline."""
    env = {k: v for k, v in os.environ.items() if k != "MPCORE_BACKEND"}
    # native half is exercised explicitly; "convert" spares the child the auto measurement
    env.update({"MPCORE_OPENCL_DEVICE": index, WIDTH_ENV: str(width),
                "MPCORE_OPENCL_HALF": "convert"})
    cmd = [sys.executable, "-m", "mpcore_opencl.smoke"]
    start = time.perf_counter()
    try:
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout,
                              check=False)
    except subprocess.TimeoutExpired:
        return classify(width, None, "", "", time.perf_counter() - start)
    return classify(width, done.returncode, done.stdout, done.stderr,
                    time.perf_counter() - start)


def cache_key(device: Device) -> str:
    """A digest of what the probe's answer depends on: the device and driver as described,
    pyopencl, and mpcore's kernel sources and shapes."""
    parts: list[str] = [str(PROBE_VERSION), device.name, device.vendor, device.kind,
                        device.capability, ",".join(sorted(device.features))]
    parts += [f"{key}={device.details.get(key)}" for key in sorted(device.details)
              if key not in ("global_memory_bytes",)]
    try:
        parts.append(metadata.version("pyopencl"))
    except metadata.PackageNotFoundError:
        parts.append("pyopencl ?")
    package = resources.files(__package__)
    for name in ("probe.py", "tiling.py", "linalg.py", "runtime.py"):
        parts.append(package.joinpath(name).read_text(encoding="utf-8"))
    for entry in sorted(package.joinpath("kernels").iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".cl"):
            parts.append(entry.read_text(encoding="utf-8"))
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()[:24]


def _cache_dirs() -> list[str]:
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    base = xdg or os.path.join(os.path.expanduser("~"), ".cache")
    return [os.path.join(base, "mpcore", "opencl-probe"),
            os.path.join(tempfile.gettempdir(), f"mpcore-{os.getuid()}", "opencl-probe")]


def load_cached(key: str) -> ProbeResult | None:
    for folder in _cache_dirs():
        try:
            with open(os.path.join(folder, key + ".json"), encoding="utf-8") as f:
                return ProbeResult.from_json(json.load(f))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return None


def store(key: str, result: ProbeResult) -> None:
    """Write ``result`` atomically (a rename), so a concurrent reader never sees half of it."""
    for folder in _cache_dirs():
        try:
            os.makedirs(folder, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=".probe-", dir=folder)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                json.dump(result.to_json(), f)
            os.replace(tmp, os.path.join(folder, key + ".json"))
            return
        except OSError:
            continue


def probe(device: Device, use_cache: bool = True,
          timeout: float = ATTEMPT_TIMEOUT_S) -> ProbeResult:
    """The widest GEMM vector width that works on ``device`` (from cache when it is there),
    trying each candidate in a subprocess."""
    key = cache_key(device)
    where = f"{device.name} ({device.index})"
    if use_cache:
        cached = load_cached(key)
        if cached is not None:  # the index may differ: another driver installed since
            return dataclasses.replace(cached, device=where)
    attempts = []
    for width in candidate_widths(device):
        attempt = run_attempt(device.index, width, timeout)
        attempts.append(attempt)
        if attempt.outcome == "ok":
            result = ProbeResult(where, width, tuple(attempts))
            store(key, result)
            return result
    return ProbeResult(where, None, tuple(attempts))
