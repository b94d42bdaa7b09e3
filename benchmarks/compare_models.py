"""``compare.py --model resnet|transformer``: the commands of both sides and the options that
shape them, kept apart from compare.py's MLP logic.

The mpcore side is ``benchmarks/model_step.py``, the peer ``benchmarks/peers/torch_<model>.py``;
both take the same shape options (:data:`SHAPE_OPTIONS`) with the same defaults, and both run
with ``OMP_NUM_THREADS`` set to ``--threads`` (default 1 for these models: on a 2-vCPU VM two
threads per process swing by tens of percent from run to run, one thread much less).
"""

from __future__ import annotations

import argparse
from pathlib import Path

HERE = Path(__file__).resolve().parent
MODEL_STEP = HERE / "model_step.py"
MODELS = ("mlp", "resnet", "transformer")
#: per model: option -> (type, default) passed to both sides as they are
SHAPE_OPTIONS: dict[str, dict[str, tuple[type, object]]] = {
    "resnet": {"--size": (int, 32), "--width": (int, 1), "--blocks": (int, 3),
               "--optimizer": (str, "sgd")},
    "transformer": {"--vocab": (int, 98), "--seq-len": (int, 64), "--d-model": (int, 128),
                    "--heads": (int, 4), "--layers": (int, 2)},
}
#: (batch, timed steps, warmup steps, threads) when not given; threads None: inherited
DEFAULTS = {"mlp": (1024, 20, 3, None), "resnet": (128, 10, 2, 1), "transformer": (32, 10, 2, 1)}
THREAD_VARS = ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--model", choices=MODELS, default="mlp",
                    help="mlp: the guide's MLP (train_step.py vs shared/peers/torch_mlp.py); "
                         "resnet, transformer: model_step.py vs benchmarks/peers/torch_*.py")
    ap.add_argument("--threads", type=int, default=None,
                    help="OMP_NUM_THREADS for both sides (default: 1 for resnet and "
                         "transformer, inherited for mlp)")
    for model, options in SHAPE_OPTIONS.items():
        group = ap.add_argument_group(f"--model {model}")
        for flag, (kind, default) in options.items():
            choices = ("sgd", "adam") if flag == "--optimizer" else None
            group.add_argument(flag, type=kind, default=default, choices=choices,
                               help=f"(default {default})")


def apply_defaults(ap: argparse.ArgumentParser, a: argparse.Namespace) -> None:
    """Fill the model's defaults into ``a`` (batch, steps, warmup, threads, paths)."""
    batch, steps, warmup, threads = DEFAULTS[a.model]
    a.batch = a.batch if a.batch is not None else batch
    a.steps = a.steps if a.steps is not None else steps
    a.warmup = a.warmup if a.warmup is not None else warmup
    a.threads = a.threads if a.threads is not None else threads
    if a.threads is not None and a.threads < 1:
        ap.error(f"--threads must be >= 1, got {a.threads}")
    if a.model == "mlp":
        a.path = a.path or ["loop", "fit"]
    elif a.path and a.path != ["fit"]:
        ap.error(f"--model {a.model} times Model.fit only: --path fit (got {' '.join(a.path)})")
    else:
        a.path = ["fit"]


def shape_args(a: argparse.Namespace) -> list[str]:
    """The shape options of ``a.model`` as command-line arguments for either side."""
    args = ["--batch", str(a.batch), "--steps", str(a.steps), "--warmup", str(a.warmup)]
    if a.model == "mlp":
        return ["--units", str(a.units), *args]
    for flag in SHAPE_OPTIONS[a.model]:
        args += [flag, str(getattr(a, flag[2:].replace("-", "_")))]
    return args


def shape_record(a: argparse.Namespace) -> dict[str, object]:
    """The shape for the JSON and the table's heading."""
    if a.model == "mlp":
        return {"units": a.units, "batch": a.batch}
    return {"batch": a.batch, **{flag[2:].replace("-", "_"): getattr(a, flag[2:].replace("-", "_"))
                                 for flag in SHAPE_OPTIONS[a.model]}}


def default_peer(model: str, mlp_peer: Path) -> Path:
    return mlp_peer if model == "mlp" else HERE / "peers" / f"torch_{model}.py"


def thread_env(env: dict[str, str], threads: int | None) -> dict[str, str]:
    """``env`` with every BLAS/OpenMP thread count set to ``threads`` (None: as it is)."""
    if threads is None:
        return env
    return {**env, **{var: str(threads) for var in THREAD_VARS}}


def mpcore_command(python: str, a: argparse.Namespace, policy: str) -> list[str]:
    cmd = [python, str(MODEL_STEP), "--model", a.model, "--policy", policy, *shape_args(a)]
    return cmd + (["--jit"] if a.jit else []) + (["--backend", a.backend] if a.backend else [])


def peer_threads(a: argparse.Namespace) -> list[str]:
    return ["--threads", str(a.threads)] if a.threads is not None and a.model != "mlp" else []
