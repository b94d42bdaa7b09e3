"""The GEMMs of one training step of the guide's MLP, one by one, in mpcore and in PyTorch.

    python benchmarks/step_gemms.py --torch-python /work/torchvenv/bin/python
    python benchmarks/step_gemms.py --quick             # tiny sizes, mpcore only
    python benchmarks/step_gemms.py --batch 128 --units 64 --engines   # oneDNN vs NumPy

A train step's float32 time is mostly its eight GEMMs (forward, input gradients, weight
gradients; the first layer's input gradient is never needed), so this tells how much of a
train-step gap to the peer (``compare.py``) is GEMM speed and how much is everything else.
Each GEMM is timed as the best of ``--repeats`` runs (after two warm-up runs) through mpcore's
``matmul`` kernel of the chosen backend, and through ``torch.mm`` on the same shapes with the
same transposed views in a separate interpreter (torch is never a dependency of mpcore). One
JSON line per GEMM, then a summary line with the totals and their ratio.

``--engines`` also times each GEMM on both engines of the CPU backend with oneDNN installed:
the CPU kernel the provider wraps (NumPy's BLAS, ``numpy_ms``) and oneDNN's primitive with the
provider's small-GEMM limit lifted (``onednn_ms``), the measurement behind
``mpcore_onednn.linalg.SMALL_GEMM``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np


def step_gemms(batch: int, units: int) -> list[tuple[str, tuple[int, int], tuple[int, int],
                                                      bool, bool]]:
    """(name, a shape, b shape, transpose_a, transpose_b) of the step's GEMMs, as the
    gradients of mpcore's dense op issue them."""
    b, u, i, o = batch, units, 784, 10
    return [("forward_1", (b, i), (i, u), False, False),
            ("forward_2", (b, u), (u, u), False, False),
            ("forward_3", (b, u), (u, o), False, False),
            ("input_grad_3", (b, o), (u, o), False, True),
            ("weight_grad_3", (b, u), (b, o), True, False),
            ("input_grad_2", (b, u), (u, u), False, True),
            ("weight_grad_2", (b, u), (b, u), True, False),
            ("weight_grad_1", (b, i), (b, u), True, False)]


def best_ms(fn: Callable[[], Any], repeats: int) -> float:
    fn()
    fn()
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best * 1e3


def measure(which: str, batch: int, units: int, repeats: int,
            backend: str | None = None) -> dict[str, float]:
    """ms per GEMM: ``which`` is "mpcore", "torch", or "numpy"/"onednn" (the CPU backend's
    two engines, see ``--engines``)."""
    rng = np.random.default_rng(0)
    out: dict[str, float] = {}
    if which == "torch":
        import torch

        for name, sa, sb, ta, tb in step_gemms(batch, units):
            a = torch.from_numpy(rng.standard_normal(sa, dtype=np.float32))
            b = torch.from_numpy(rng.standard_normal(sb, dtype=np.float32))
            a, b = (a.t() if ta else a), (b.t() if tb else b)
            out[name] = best_ms(lambda a=a, b=b: torch.mm(a, b), repeats)
        return out
    import mpcore as mp

    be = mp.get_backend(backend) if backend else mp.get_backend()
    matmul = be.kernels()["matmul"]
    if which in ("numpy", "onednn"):
        matmul = _engine(matmul, which)
    for name, sa, sb, ta, tb in step_gemms(batch, units):
        a = be.asarray(rng.standard_normal(sa, dtype=np.float32), "float32")
        b = be.asarray(rng.standard_normal(sb, dtype=np.float32), "float32")

        def run(a: Any = a, b: Any = b, ta: bool = ta, tb: bool = tb) -> None:
            matmul(a, b, ta, tb)
            be.synchronize()

        out[name] = best_ms(run, repeats)
    return out


def _engine(matmul: Any, which: str) -> Any:
    """The CPU backend's ``matmul`` on one engine: the CPU kernel oneDNN's provider wraps, or
    oneDNN's GEMM at every size."""
    original = getattr(matmul, "original", None)
    if original is None:
        raise SystemExit("--engines needs the CPU backend with oneDNN's provider in use: "
                         "pip install -e \".[onednn]\", and MPCORE_ONEDNN=auto or force "
                         "(choices: auto, force, off)")
    if which == "numpy":
        return original
    import mpcore_onednn.linalg

    if not mpcore_onednn.float32_wanted():
        raise SystemExit("--engines times oneDNN's float32 GEMM: MPCORE_ONEDNN_FLOAT32=off "
                         "leaves float32 on NumPy")

    def onednn(a: Any, b: Any, transpose_a: bool, transpose_b: bool) -> Any:
        limit, mpcore_onednn.linalg.SMALL_GEMM = mpcore_onednn.linalg.SMALL_GEMM, 0
        try:
            return matmul(a, b, transpose_a, transpose_b)
        finally:
            mpcore_onednn.linalg.SMALL_GEMM = limit

    return onednn


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--units", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--backend", default=None, help="mpcore backend (default: current)")
    parser.add_argument("--torch-python", default=None,
                        help="an interpreter with torch, e.g. /work/torchvenv/bin/python")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat")
    parser.add_argument("--engines", action="store_true",
                        help="also time NumPy's and oneDNN's GEMM (the CPU backend with oneDNN)")
    parser.add_argument("--peer-only", action="store_true", help=argparse.SUPPRESS)
    a = parser.parse_args()
    if a.quick:
        a.batch, a.units, a.repeats = 32, 16, 1
    if a.peer_only:
        print(json.dumps(measure("torch", a.batch, a.units, a.repeats)))
        return
    ours = measure("mpcore", a.batch, a.units, a.repeats, a.backend)
    engines = {e: measure(e, a.batch, a.units, a.repeats, a.backend)
               for e in (("numpy", "onednn") if a.engines else ())}
    peer: dict[str, float] = {}
    if a.torch_python:
        proc = subprocess.run([a.torch_python, __file__, "--peer-only", "--batch", str(a.batch),
                               "--units", str(a.units), "--repeats", str(a.repeats)],
                              capture_output=True, text=True, check=True)
        peer = json.loads(proc.stdout.strip().splitlines()[-1])
    for name, sa, sb, ta, tb in step_gemms(a.batch, a.units):
        m, k = (sa[1], sa[0]) if ta else sa
        n = sb[0] if tb else sb[1]
        record = {"bench": "step_gemm", "gemm": name, "m": m, "n": n, "k": k,
                  "transpose_a": ta, "transpose_b": tb, "mpcore_ms": round(ours[name], 4),
                  "mpcore_gflops": round(2 * m * n * k / ours[name] / 1e6, 1)}
        for engine, times in engines.items():
            record[f"{engine}_ms"] = round(times[name], 4)
        if name in peer:
            record["torch_ms"] = round(peer[name], 4)
            record["torch_vs_mpcore_time"] = round(peer[name] / ours[name], 3)
        print(json.dumps(record), flush=True)
    summary: dict[str, Any] = {"bench": "step_gemms_total", "batch": a.batch, "units": a.units,
                               "mpcore_ms": round(sum(ours.values()), 3)}
    if peer:
        summary["torch_ms"] = round(sum(peer.values()), 3)
        summary["mpcore_speed_vs_torch"] = round(sum(peer.values()) / sum(ours.values()), 3)
    print(json.dumps(summary), flush=True)


if __name__ == "__main__":
    sys.exit(main())
