"""Model train-step benchmark: mpcore's ResNet-20-style network or small char transformer
(``benchmarks/model_zoo.py``) trained through ``Model.fit`` on random data, per policy. One
JSON line per policy; the PyTorch twins are ``benchmarks/peers/torch_resnet.py`` and
``torch_transformer.py`` (same shapes, same options), and ``compare.py --model`` runs both.

    python benchmarks/model_step.py --model resnet --policy float32 mixed_bfloat16 --threads 1
    python benchmarks/model_step.py --model transformer --jit      # traced steps
    python benchmarks/model_step.py --model resnet --quick         # tiny sizes (a smoke run)

Each step is one batch of ``Model.fit`` (``shuffle=False``, ``verbose=0``), the data already
on the host as the peer's is on its device; ``--warmup`` steps (at least one: the first builds
the optimizer's slots and, under ``--jit``, records the trace) run in a ``fit`` call of their
own before the timed one. The time is that of the whole timed ``fit`` divided by its steps, as
the peer times its loop.

``--threads N`` sets ``OMP_NUM_THREADS`` (and OpenBLAS'/MKL's) to N before NumPy loads; the
JSON says the thread count the run had (``threads``: the variable's value, or null if unset).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import sys
import time
from typing import Any

MODELS = ("resnet", "transformer")
POLICIES = ("float32", "mixed_float16", "mixed_bfloat16")
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", choices=MODELS, required=True)
    ap.add_argument("--policy", nargs="+", choices=POLICIES, default=["float32"])
    ap.add_argument("--backend", default=None, help="mpcore backend (default: the current one)")
    ap.add_argument("--batch", type=int, default=None,
                    help="batch size (default: resnet 128, transformer 32)")
    ap.add_argument("--steps", type=int, default=None, help="timed steps (default 10)")
    ap.add_argument("--warmup", type=int, default=None, help="untimed steps (default 2)")
    ap.add_argument("--jit", action="store_true", help="compile(jit_compile=True)")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for this process (default: inherited)")
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    res = ap.add_argument_group("resnet")
    res.add_argument("--size", type=int, default=32, help="image side (32: MNIST padded)")
    res.add_argument("--width", type=int, default=1, help="channel multiplier of 16/32/64")
    res.add_argument("--blocks", type=int, default=3, help="blocks per stage (3: ResNet-20)")
    res.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    lm = ap.add_argument_group("transformer")
    lm.add_argument("--vocab", type=int, default=98, help="98: mp.datasets.stdlib_text's")
    lm.add_argument("--seq-len", type=int, default=64)
    lm.add_argument("--d-model", type=int, default=128)
    lm.add_argument("--heads", type=int, default=4)
    lm.add_argument("--layers", type=int, default=2)
    return ap


def build(a: argparse.Namespace) -> tuple[Any, dict[str, Any], Any, Any]:
    """(compiled model, the shape for the record, inputs, targets) for ``a``'s model; random
    data for ``(warmup + steps) * batch`` samples."""
    import numpy as np
    from model_zoo import ResNetShape, TransformerShape, optimizer, resnet, transformer

    import mpcore as mp

    rng = np.random.default_rng(0)
    n = (a.warmup + a.steps) * a.batch
    if a.model == "resnet":
        rs = ResNetShape(size=a.size, width=a.width, blocks=a.blocks)
        model, opt = resnet(rs), optimizer(a.optimizer)
        x = rng.random((n, a.size, a.size, 1), dtype=np.float32)
        y = rng.integers(0, rs.classes, n).astype(np.int32)
        shape = {**rs.__dict__, "optimizer": a.optimizer}
    else:
        ts = TransformerShape(vocab=a.vocab, seq_len=a.seq_len, d_model=a.d_model,
                              heads=a.heads, layers=a.layers)
        model, opt = transformer(ts), optimizer("adam")
        x = rng.integers(0, a.vocab, (n, a.seq_len)).astype(np.int32)
        y = rng.integers(0, a.vocab, (n, a.seq_len)).astype(np.int32)
        shape = {**ts.__dict__, "optimizer": "adam"}
    model.compile(optimizer=opt, loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True),
                  jit_compile=a.jit)
    return model, shape, x, y


def measure(a: argparse.Namespace, policy: str) -> dict[str, Any]:
    from model_zoo import missing_layers

    import mpcore as mp

    backend = mp.get_backend(a.backend) if a.backend else mp.get_backend()
    record: dict[str, Any] = {"bench": "model_step", "model": a.model, "path": "fit",
                              "backend": backend.name, "policy": policy, "batch": a.batch,
                              "jit": a.jit, "threads": _threads()}
    missing = missing_layers(a.model)
    if missing:
        return {**record, "skipped": f"mp.layers lacks {', '.join(missing)} (issue 32)"}
    try:
        verdict = mp.check_policy(policy, backend)
        record.update(device=backend.device().name, fast=verdict.fast, why=verdict.reason,
                      providers=[k.provider for k in backend.kernel_sets])
    except Exception as exc:
        return {**record, "skipped": f"{type(exc).__name__}: {exc}"}
    mp.set_backend(backend.name)
    mp.set_global_policy(policy)
    try:
        model, shape, x, y = build(a)
        record.update(shape)
        record["params"] = sum(math.prod(v.shape) for v in model.trainable_variables)
        warm = max(a.warmup, 1) * a.batch
        model.fit(x[:warm], y[:warm], batch_size=a.batch, epochs=1, verbose=0, shuffle=False)
        timed = slice(warm, warm + a.steps * a.batch)
        backend.synchronize()
        t0 = time.perf_counter()
        history = model.fit(x[timed], y[timed], batch_size=a.batch, epochs=1, verbose=0,
                            shuffle=False)
        backend.synchronize()
        dt = (time.perf_counter() - t0) / a.steps
    finally:
        mp.set_global_policy(None)
    loss = (getattr(history, "history", {}).get("loss") or [math.nan])[-1]
    record.update(ms_per_step=round(dt * 1e3, 3), samples_per_s=round(a.batch / dt, 1),
                  steps=a.steps, loss=round(float(loss), 5) if math.isfinite(loss) else None,
                  max_rss_mb=round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1))
    if a.model == "transformer":
        record["tokens_per_s"] = round(a.batch * a.seq_len / dt, 1)
    return record


def _threads() -> int | None:
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() else None


def main(argv: list[str] | None = None) -> int:
    ap = parser()
    a = ap.parse_args(argv)
    if a.threads is not None:
        if a.threads < 1:
            ap.error(f"--threads must be >= 1, got {a.threads}")
        # before NumPy (and its BLAS) loads: a thread pool's size is read once, at start
        for var in THREAD_VARS:
            os.environ[var] = str(a.threads)
    if a.quick:
        a.size, a.width, a.blocks = 8, 1, 1
        a.seq_len, a.d_model, a.heads, a.layers = 8, 16, 2, 1
    a.batch = a.batch or (4 if a.quick else 128 if a.model == "resnet" else 32)
    a.steps = a.steps or (2 if a.quick else 10)
    a.warmup = a.warmup if a.warmup is not None else (1 if a.quick else 2)
    for name, value in (("--batch", a.batch), ("--steps", a.steps)):
        if value < 1:
            ap.error(f"{name} must be >= 1, got {value}")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # model_zoo beside us
    for policy in a.policy:
        print(json.dumps(measure(a, policy)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
