"""For the tests of the oneDNN provider: its library (or a skip), and its probes under another
instruction set.

oneDNN picks its kernels by the CPU's instruction set, capped by ``ONEDNN_MAX_CPU_ISA`` (read
once per process). On a CPU with avx512_bf16, capping it at ``AVX512_CORE`` runs the code of a
CPU without it for real: bfloat16 rounded in software instead of by ``vcvtneps2bf16``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

#: oneDNN ISAs whose bfloat16 conversions are the CPU's instructions (avx512_bf16's or
#: AVX-NE-CONVERT's ``vcvtneps2bf16``), which flush subnormals to zero
NATIVE_BF16_ISAS = frozenset({"avx512_core_bf16", "avx512_core_fp16", "avx512_core_amx",
                              "avx512_core_amx_fp16", "avx2_vnni_2"})

_PROBES = """
import json
import ml_dtypes, numpy as np
import mpcore_onednn
from mpcore_cpu import CpuBackend
from mpcore_cpu.creation import convert
from mpcore_onednn import creation as reorder
from mpcore_onednn import nn as relu
from mpcore_onednn.elementwise import BinaryCache

lib = mpcore_onednn.library()
f32, bf16 = np.dtype(np.float32), np.dtype(ml_dtypes.bfloat16)
cpu = CpuBackend()
binary, reorders = BinaryCache(lib), reorder.ReorderCache(lib)
# every bfloat16, and every 4093rd float32 pattern (every sign and exponent)
sweep = {bf16: np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(bf16),
         f32: np.arange(0, 1 << 32, 4093, dtype=np.uint64).astype(np.uint32).view(f32)}

same = reorder.same_as_astype


found = {"isa": lib.isa, "reorder": {},
         "relu": {d.name: relu._probe(binary, cpu.relu_grad_bias, d) for d in (f32, bf16)}}
with np.errstate(invalid="ignore", over="ignore"):
    for s, d in ((f32, bf16), (bf16, f32)):
        x, want = sweep[s], sweep[s].astype(d)
        raw = np.empty(x.shape, d)
        reorders.run(x, raw, *reorder.PAIRS[(s, d)])
        cast = reorder.ReorderCast(convert, reorders)
        normal = ~reorder.subnormals(x) if s == f32 else np.ones(x.shape, bool)
        found["reorder"][f"{s.name}->{d.name}"] = {
            "verdict": reorder.probe(reorders, s, d), "reorder_exact": same(raw, want),
            "exact_but_subnormals": same(raw[normal], want[normal]),
            "cast_exact": same(cast(x, d), want)}
print(json.dumps(found))
"""


def run_under(isa: str, code: str, **settings: str) -> dict[str, Any]:
    """What ``code`` prints last (a JSON object), run in a process whose oneDNN is capped at
    ``isa``, with ``MPCORE_ONEDNN=force`` and the given environment ``settings``."""
    env = {**os.environ, "ONEDNN_MAX_CPU_ISA": isa, "MPCORE_ONEDNN": "force", **settings}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def probes_under(isa: str) -> dict[str, Any]:
    """In a process whose oneDNN is capped at ``isa``: the ISA it runs at (``isa``), the relu
    probe's verdict per dtype (``relu``), and per reorder direction (``reorder``) the probe's
    verdict, whether the raw reorder gives ``astype``'s bits on a sweep of patterns, and
    whether the conversion kernel (the reorder where trusted) does."""
    return run_under(isa, _PROBES)


def library_or_skip() -> Any:
    """The oneDNN library the provider loads, or a skip naming why it cannot be loaded."""
    import mpcore_onednn
    import pytest
    from mpcore_onednn import dnnl

    try:
        return mpcore_onednn.library()
    except dnnl.DnnlError as exc:
        pytest.skip(f"oneDNN cannot be loaded here: {exc}")


def onednn_backend(monkeypatch: Any, mode: str, small_gemms_on_onednn: bool = False) -> Any:
    """A fresh CPU backend with oneDNN's provider in use in ``mode`` ("auto" or "force") and
    float32 work on (or a skip where the library cannot load); ``small_gemms_on_onednn``: the
    GEMMs it leaves to NumPy (``linalg.SMALL_GEMM``) too."""
    import mpcore_onednn.linalg
    from mpcore_cpu import CpuBackend

    library_or_skip()
    monkeypatch.setenv("MPCORE_ONEDNN", mode)
    monkeypatch.setenv("MPCORE_ONEDNN_FLOAT32", "on")
    if small_gemms_on_onednn:
        monkeypatch.setattr(mpcore_onednn.linalg, "SMALL_GEMM", 0)
    backend = CpuBackend()
    backend.kernels()
    assert "mpcore_onednn" in [s.provider for s in backend.kernel_sets]
    return backend
