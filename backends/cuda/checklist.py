"""The GPU checklist of this folder's README as one run with a deadline, for a lent GPU machine.

A session is lent a GPU rarely and for minutes (device time counts from the machine's start),
so the checks run in order of what they tell, each under its own time limit and all under one
budget; what the budget cannot reach is reported as not run, never left hanging. Standard
library only: it makes the checkout importable itself, without pip (:func:`importable_env`).

Run from the checkout's root on the device, with the PyTorch peer copied into ``.device/``
beforehand (``mkdir -p .device && cp ../shared/peers/torch_mlp.py .device/``, then the device
tool's ``run`` with ``carry: [".device"]``)::

    python3 backends/cuda/checklist.py --out "$OUT"           # budget 480 s
    python3 backends/cuda/checklist.py --dry-run              # the plan, nothing run

cuBLASLt's headers may be missing there: copy them into ``.device/include`` too (this folder's
README says how); the checks then find them through ``MPCORE_CUBLASLT_INCLUDE``.

Each log goes to ``OUT/<log>.log`` (seven logs at most, plus ``summary.json``: the device
tool brings back eight files), and the summary, one line per check, is printed last.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

#: Seconds the whole run may take by default: a device call's 600 s limit, less headroom.
BUDGET_S = 480
#: A check with fewer seconds left than this is not started.
MIN_LIMIT_S = 15
PEER = ".device/torch_mlp.py"
SITE = "/tmp/mpcore-site"
#: cuBLASLt's headers carried in (cublasLt.h, cublas_api.h, library_types.h), searched after the
#: device's own CUDA install (its wheels may ship libcublasLt without them).
INCLUDE = ".device/include"
#: Wheels carried in for what the device image lacks (oneDNN, for the host CPU's AMX and
#: avx512_bf16), installed under the prefix :data:`WHEEL_SITE` without an index.
WHEELS = ".device/wheels"
WHEEL_SITE = "/tmp/mpcore-wheels"


@dataclass(frozen=True)
class Check:
    """One command: ``log`` names the file its output is appended to, ``limit_s`` bounds it,
    ``env`` is added to the environment."""

    name: str
    log: str
    limit_s: int
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass
class Outcome:
    name: str
    status: str          # "passed", "failed", "timed out", "not run"
    seconds: float = 0.0
    returncode: int | None = None
    last_line: str = ""


def plan(python: str = sys.executable, peer: str | None = PEER) -> list[Check]:
    """The checks, most telling first: the device and mpcore's view of it; the CUDA backend's
    own tests (kernels against the CPU, CUDA graphs) and the GPU-marked ones (NCCL); traced
    steps on CUDA with and without graphs; the benchmarks (graphs on/off at 64 units, the
    guide's size against the PyTorch peer); the whole suite with CUDA current. The FP8 item
    (``fp8 gemms``, :mod:`mpcore_cuda.fp8_check`) follows the CUDA tests."""
    pytest = (python, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-rs")
    bench = (python, "benchmarks/cuda_train_step.py")
    small = ("--units", "64", "--batch", "8192", "--no-peer", "--policy", "float32",
             "mixed_float16")
    cuda = {"MPCORE_BACKEND": "cuda"}
    checks = [
        Check("nvidia-smi", "info", 20, ("nvidia-smi",)),
        Check("mpcore info", "info", 60, (python, "-m", "mpcore", "info")),
        Check("cuda tests", "cuda_tests", 180, (*pytest, "tests/backends/cuda")),
        Check("gpu-marked tests", "cuda_tests", 60, (*pytest, "-m", "gpu")),
        # cuBLASLt FP8 GEMMs against the emulated ones, then FP8 vs bfloat16 at 8192x4096x4096
        Check("fp8 gemms", "fp8", 120, (python, "-m", "mpcore_cuda.fp8_check")),
        # the contract a third-party backend is held to: dtypes and shapes of every kernel
        Check("conformance", "cuda_tests", 120, (python, "-m", "mpcore", "conformance", "cuda")),
        Check("traced steps on cuda", "traced", 150,
              (*pytest, "tests/tracing/test_traced_steps.py",
               "tests/backends/cuda/test_cuda_graphs.py", "--log-level=INFO",
               "-o", "log_cli=true"), cuda),
        Check("traced steps, graphs off", "traced", 90,
              (*pytest, "-x", "tests/tracing/test_traced_steps.py"),
              {**cuda, "MPCORE_CUDA_GRAPHS": "0"}),
        Check("bench graphs on", "bench", 60, (*bench, "--jit", *small),
              {"MPCORE_CUDA_GRAPHS": "1"}),
        Check("bench graphs off", "bench", 60, (*bench, "--jit", *small),
              {"MPCORE_CUDA_GRAPHS": "0"}),
        Check("bench eager", "bench", 60, (*bench, *small)),
        Check("bench vs torch", "bench", 150,
              (*bench, "--policy", "float32", "mixed_float16", "mixed_bfloat16", "--units",
               "4096", "--batch", "8192", "--steps", "20",
               *(("--peer", peer) if peer else ("--no-peer",)))),
        Check("bench vs torch, traced", "bench", 90,
              (*bench, "--jit", "--policy", "float32", "mixed_float16", "mixed_bfloat16",
               "--units", "4096", "--batch", "8192", "--steps", "20",
               *(("--peer", peer) if peer else ("--no-peer",)))),
        Check("kernel profile", "bench", 60,
              (python, "benchmarks/cuda_profile.py", "--policy", "float32", "mixed_float16",
               "mixed_bfloat16", "--units", "4096", "--batch", "8192")),
        Check("kernel profile, cuBLAS route", "bench", 45,
              (python, "benchmarks/cuda_profile.py", "--policy", "mixed_float16",
               "mixed_bfloat16", "--units", "4096", "--batch", "8192"),
              {"MPCORE_CUDA_GEMM16": "cublas"}),
        # the host CPU of a GPU machine (an Intel Xeon with AMX here so far): the CPU
        # backend's own kernels, oneDNN's where its wheel was carried in (WHEELS)
        Check("host cpu kernels", "host_cpu", 90,
              (*pytest, "tests/backends/cpu", "tests/backends/onednn", "-x")),
        Check("suite on cuda", "suite_cuda", 300, (*pytest, "--maxfail=20"), cuda),
    ]
    return checks


def run_check(check: Check, limit_s: float, out: Path,
              env: Mapping[str, str] | None = None) -> Outcome:
    """Run one check for at most ``limit_s`` seconds, its output appended to its log. A check
    that outlives its limit is killed with its whole process group (pytest's children too)."""
    log = out / f"{check.log}.log"
    start = time.monotonic()
    with log.open("a") as f:
        f.write(f"\n=== {check.name}: {' '.join(check.argv)} (limit {limit_s:.0f} s)\n")
        f.flush()
        try:
            proc = subprocess.Popen(check.argv, stdout=f, stderr=subprocess.STDOUT,
                                    env={**(env or os.environ), **check.env,
                                         "PYTHONUNBUFFERED": "1"},
                                    start_new_session=True)
        except OSError as exc:
            f.write(f"could not start: {exc}\n")
            return Outcome(check.name, "failed", round(time.monotonic() - start, 1), None, str(exc))
        try:
            code: int | None = proc.wait(timeout=limit_s)
            status = "passed" if code == 0 else "failed"
        except subprocess.TimeoutExpired:
            _kill_group(proc)
            code, status = None, "timed out"
    return Outcome(check.name, status, round(time.monotonic() - start, 1), code,
                   _last_line(log))


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    for sig, wait in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


def _last_line(log: Path) -> str:
    lines = [ln.strip() for ln in log.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1][:300] if lines else ""


def run_all(checks: Sequence[Check], budget_s: float, out: Path,
            env: Mapping[str, str] | None = None,
            clock: Callable[[], float] = time.monotonic) -> list[Outcome]:
    """Every check in order, each for at most its limit and what is left of ``budget_s``;
    once fewer than :data:`MIN_LIMIT_S` seconds are left the rest are "not run"."""
    out.mkdir(parents=True, exist_ok=True)
    deadline = clock() + budget_s
    outcomes = []
    for check in checks:
        left = deadline - clock()
        if left < MIN_LIMIT_S:
            outcomes.append(Outcome(check.name, "not run", last_line="the budget was spent"))
            continue
        outcomes.append(run_check(check, min(check.limit_s, left), out, env))
    return outcomes


def link_site(repo: Path, site: Path) -> Path:
    """A folder that makes the checkout importable without building it: a link per package
    of pyproject.toml's ``package-dir`` and an ``mpcore-<version>.dist-info`` holding the
    name, version and entry points (the plugins are found through them). Put it on
    PYTHONPATH."""
    import tomllib

    project = tomllib.loads((repo / "pyproject.toml").read_text())
    meta = project["project"]
    if site.exists():
        shutil.rmtree(site)
    site.mkdir(parents=True)
    for package, folder in project["tool"]["setuptools"]["package-dir"].items():
        (site / package).symlink_to((repo / folder).resolve(), target_is_directory=True)
    info = site / f"{meta['name']}-{meta['version']}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {meta['name']}\n"
                                   f"Version: {meta['version']}\n")
    groups = {"console_scripts": meta.get("scripts", {}), **meta.get("entry-points", {})}
    (info / "entry_points.txt").write_text("".join(
        f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in points.items()) + "\n"
        for group, points in groups.items() if points))
    return site


def importable_env(repo: Path, site: Path = Path(SITE)) -> dict[str, str]:
    """The environment the checks run in: the checkout on PYTHONPATH through
    :func:`link_site`. Not pip: the device reaches no package index, and an image whose
    setuptools predates PEP 639 cannot even build the project's metadata (``license =
    "Apache-2.0"``), as a venv's own setuptools here could not."""
    link_site(repo, site)
    paths = [str(site), *carried_wheels(repo / WHEELS, Path(WHEEL_SITE))]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    if (repo / INCLUDE).is_dir():
        env["MPCORE_CUBLASLT_INCLUDE"] = str((repo / INCLUDE).resolve())
    return env


def carried_wheels(folder: Path, prefix: Path) -> list[str]:
    """The wheels in ``folder`` installed under ``prefix`` by pip without an index (none: no
    folder), as PYTHONPATH entries; a failed install is printed and left out. A prefix, not
    ``--target``: pip's ``--target`` drops a wheel's data files in ``lib/`` (oneDNN's
    libdnnl.so), and the prefix keeps where the wheel's RECORD says they are."""
    wheels = sorted(folder.glob("*.whl")) if folder.is_dir() else []
    if not wheels:
        return []
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index",
                           "--no-deps", "--no-compile", "--no-warn-script-location",
                           "--ignore-installed", "--prefix", str(prefix), *map(str, wheels)],
                          capture_output=True, text=True, timeout=120, check=False)
    if proc.returncode != 0:
        print(f"carried wheels not installed: {proc.stderr.strip()[-300:]}", file=sys.stderr)
        return []
    # where pip put them (the prefix's scheme varies: venv, posix_prefix, Debian's local)
    return sorted({str(info.parent) for info in prefix.rglob("*.dist-info")})


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default=os.environ.get("OUT") or "gpu_checks",
                    help="folder for the logs and summary.json (default: $OUT or gpu_checks)")
    ap.add_argument("--budget", type=float, default=BUDGET_S,
                    help=f"seconds for the whole run (default {BUDGET_S})")
    ap.add_argument("--dry-run", action="store_true", help="print the plan and run nothing")
    ap.add_argument("--only", nargs="+", metavar="NAME",
                    help="run only the checks named (a rerun after fixes); default: all")
    a = ap.parse_args(argv)
    out = Path(a.out).resolve()
    repo = Path(__file__).resolve().parents[2]
    os.chdir(repo)                   # the plan's paths are the checkout's
    peer = PEER if Path(PEER).exists() else None
    checks = plan(sys.executable, peer)
    if a.only:
        names = [c.name for c in checks]
        unknown = [n for n in a.only if n not in names]
        if unknown:
            ap.error(f"no check named {', '.join(map(repr, unknown))}; the checks: "
                     f"{', '.join(map(repr, names))}")
        checks = [c for c in checks if c.name in a.only]
    if a.dry_run:
        for c in checks:
            env = " ".join(f"{k}={v}" for k, v in c.env.items())
            print(f"{c.name} [{c.log}.log, {c.limit_s} s]: {env + ' ' if env else ''}"
                  f"{' '.join(c.argv)}")
        if peer is None and any("--no-peer" in c.argv for c in checks):
            print(f"no {PEER}: the benchmark runs without the PyTorch peer")
        return 0
    outcomes = run_all(checks, a.budget, out, importable_env(repo))
    summary = [vars(o) for o in outcomes]
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    for o in outcomes:
        print(f"{o.name:28s} {o.status:9s} {o.seconds:6.1f} s  {o.last_line}")
    return 0 if all(o.status == "passed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
