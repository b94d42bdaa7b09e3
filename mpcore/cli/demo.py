"""``mpcore demo``: the Keras mixed precision guide, end to end, on the current backend.

It prints the device and the compatibility check, builds the guide's model (Dense-relu,
Dense-relu, Dense, then a float32 softmax), trains it on MNIST with float32 and with the best
mixed policy for the device (or ``--policy``), and prints test accuracy, time per sample and the
speed ratio (``--inspect`` prints the numerics inspector's report on one batch instead of
training). Decisions, written out in the output too:

- Units: 4096 when the mixed policy is judged fast on an accelerator (as the guide does on a
  GPU), else 64 (the guide's CPU size); ``--units`` overrides.
- Best mixed policy: mixed_float16 where it is fast (the guide's GPU choice), else
  mixed_bfloat16 where it is fast; where neither is, mixed_bfloat16 (no loss scaling needed,
  float32's range) and the output says it will not be faster. ``--policy mixed_float8`` (FP8
  GEMMs, emulated where the hardware has none) is never chosen for you: it is not faster on
  any backend yet.
- Under mixed_float8 the 10-wide output layer computes in mixed_bfloat16, as Transformer
  Engine keeps the last layer out of FP8 (its 10 columns are no multiple of 16, and the
  logits are the most precision-sensitive GEMM of the model).
- Batch size: the guide's 8192, unless that would give fewer than 10 steps per epoch (the
  8,000-image offline split leaves 6,400 training samples: 1 step), then 128; ``--batch-size``
  overrides.
- Time per sample: the mean over epochs after the first (the first includes warm-up).
- ``--ranks N``: the same demo as a data-parallel job (``mp.distribution.DataParallel``) of N
  ranks started with ``mpiexec -n N python -m mpi4py -m mpcore demo ...``, each with
  cores/N threads; the batch size is global and rank 0 prints.

Every argument is checked before any work (the backend, the data, training): a number out of
range, or a plot file that cannot be written, is an error that names the argument and what is
valid, not a traceback after two trainings.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mpcore.cli import demo_report
from mpcore.cli.demo_report import REWRITE
from mpcore.plugins.extras import install_command
from mpcore.plugins.hookspecs import hookimpl

if TYPE_CHECKING:
    from mpcore.cli.commands import Subcommands

GUIDE_BATCH = 8192
SMALL_BATCH = 128
MIN_STEPS = 10
VALIDATION_SPLIT = 0.2
MIXED_POLICIES = ("mixed_float16", "mixed_bfloat16", "mixed_float8")
#: The policies the demo picks from by itself (mixed_float8 only with --policy).
AUTO_POLICIES = ("mixed_float16", "mixed_bfloat16")
PLOT_FORMATS = ("png", "pdf", "svg", "jpg", "jpeg")
RANKS_ENV = "MPCORE_DEMO_RANKS"  # set in the ranks of an `mpcore demo --ranks N` job


def choose_policy(backend: Any, device: Any = None) -> tuple[str, str]:
    """(policy, why) on ``device`` (by default the backend's own): a pure function of the
    backend's verdicts on that device description, so it can be checked for any device."""
    device = backend.device() if device is None else device
    verdicts = {p: backend.policy_support(p, device) for p in AUTO_POLICIES}
    if verdicts["mixed_float16"].fast:
        return "mixed_float16", "mixed_float16 is fast on this device"
    if verdicts["mixed_bfloat16"].fast:
        return "mixed_bfloat16", "mixed_bfloat16 is fast on this device"
    for p in ("mixed_bfloat16", "mixed_float16"):
        if verdicts[p].supported:
            return p, (f"no mixed policy is fast on this device; {p} is supported (emulated), so "
                       "expect no speed-up")
    raise RuntimeError(f"backend {backend.name!r} supports no mixed policy")


def _positive_problem(value: Any) -> str | None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        return f"must be a whole number >= 1, got {value!r}"
    return None


def positive_int(text: str) -> int:
    """argparse type: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    problem = _positive_problem(value)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return value


def plot_problem(path: str) -> str | None:
    """Why the demo could not write its plot to ``path``, or None: found before training,
    not after it. matplotlib must be installed and know the format (from the extension), the
    folder must exist and take a new file, and ``path`` must not be a folder."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return "needs matplotlib: " + install_command("plot")
    target = Path(path)
    if target.is_dir():
        return f"{path!r} is a folder; give a file name in it"
    if target.suffix.lower().lstrip(".") not in PLOT_FORMATS:
        return (f"{path!r} must end in one of {', '.join('.' + f for f in PLOT_FORMATS)} "
                "(the format of the plot)")
    folder = target.parent
    if not folder.is_dir():
        what = "is not a folder" if folder.exists() else "does not exist"
        return f"the folder of {path!r} ({str(folder)!r}) {what}"
    if target.exists() and not os.access(target, os.W_OK):
        return f"{path!r} exists and cannot be overwritten"
    try:  # the only reliable test of a folder (permissions, read-only mounts, /proc)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        return f"cannot write a file in the folder of {path!r}: {exc.strerror or exc}"
    return None


def plot_file(text: str) -> str:
    """argparse type: a plot file the demo can write (see :func:`plot_problem`)."""
    problem = plot_problem(text)
    if problem is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def _check_arguments(units: int | None, policy: str | None, epochs: int,
                     batch_size: int | None, plot: str | None, verbose: int) -> None:
    """Every bad argument of :func:`run` is an error before any work is done."""
    for name, value in (("units", units), ("epochs", epochs), ("batch_size", batch_size)):
        if value is not None and (problem := _positive_problem(value)) is not None:
            raise ValueError(f"{name} {problem}")
    if policy is not None and policy not in MIXED_POLICIES:
        raise ValueError(f"policy must be a mixed policy, one of {', '.join(MIXED_POLICIES)}, "
                         f"got {policy!r}")
    if verbose not in (0, 1, 2):
        raise ValueError(f"verbose must be 0, 1 or 2, got {verbose!r}")
    if plot is not None and (problem := plot_problem(plot)) is not None:
        raise ValueError(f"plot: {problem}")


def build_model(units: int) -> Any:
    """The guide's model, under the current policy (under mixed_float8, the output layer in
    mixed_bfloat16: see the module's docstring)."""
    import mpcore as mp

    last = {"dtype": "mixed_bfloat16"} if mp.global_policy().name == "mixed_float8" else {}
    inputs = mp.Input(shape=(784,), name="digits")
    x = mp.layers.Dense(units, activation="relu", name="dense_1")(inputs)
    x = mp.layers.Dense(units, activation="relu", name="dense_2")(x)
    x = mp.layers.Dense(10, name="dense_logits", **last)(x)
    outputs = mp.layers.Activation("softmax", dtype="float32", name="predictions")(x)
    return mp.Model(inputs=inputs, outputs=outputs)


def _prepare(x: Any, y: Any, backend: Any) -> tuple[Any, Any]:
    from mpcore import ops

    images = ops.constant(x, backend=backend)
    flat = ops.reshape(images, (images.shape[0], -1))
    return ops.divide(ops.cast(flat, "float32"), 255.0), ops.constant(y, backend=backend)


def run(units: int | None = None, policy: str | None = None, epochs: int = 5,
        batch_size: int | None = None, plot: str | None = None, seed: int = 0,
        verbose: int = 1, out: Callable[[str], Any] = print,
        rewrite: bool = False) -> dict[str, Any]:
    """Run the demo; returns {"runs": {policy: {...}}, "units", "batch_size", "split"}.
    ``rewrite``: a third run, the float32 model with the mixed precision graph rewrite, whose
    painted graph (each op's dtype and the rule that decided it) is printed."""
    import mpcore as mp
    from mpcore.amp.target import device_dtype
    from mpcore.callbacks import LossScaleMonitor
    from mpcore.datasets import mnist
    from mpcore.mixed_precision.verdict import check_policy, compatibility_message
    from mpcore.plugins.registry import detection_note

    _check_arguments(units, policy, epochs, batch_size, plot, verbose)
    # a bad MPCORE_AMP_* edit is an error before anything trains, not after two runs
    lists = mp.mixed_precision.AutoMixedPrecisionLists().with_env() if rewrite else None
    backend = mp.get_backend()
    device = backend.device()
    out("mpcore demo: the Keras mixed precision guide on MNIST")
    out(f"Backend: {backend.name} ({detection_note()})")
    out(f"Device: {device.name} [{device.kind}, {device.vendor or '?'}, "
        f"{device.capability or '-'}]")
    if policy is None:
        policy, why = choose_policy(backend, device)
    else:
        why = "chosen with --policy"
    out(compatibility_message(policy, backend))
    out(f"Mixed policy: {policy} ({why})")
    verdict = check_policy(policy, backend)
    if units is None:
        accelerator = verdict.fast and device.kind != "cpu"
        units = 4096 if accelerator else 64
        out(f"Units: {units} ({'a fast accelerator' if accelerator else 'no fast accelerator'}; "
            "the guide uses 4096 on a GPU, 64 on a CPU; --units to override)")
    else:
        out(f"Units: {units} (--units)")

    data = mnist.load(warn=False)      # the offline split is said just below, once
    if data.split == "offline":
        out(f"Data: OFFLINE SPLIT of the MNIST test set ({data.source}): first "
            f"{len(data.x_train):,} images to train, last {len(data.x_test):,} to test; not the "
            "full 60,000/10,000 set")
    else:
        out(f"Data: MNIST, {len(data.x_train):,} train / {len(data.x_test):,} test images "
            f"({data.source})")
    x_train, y_train = _prepare(data.x_train, data.y_train, backend)
    x_test, y_test = _prepare(data.x_test, data.y_test, backend)
    fit_samples = int(len(data.x_train) * (1 - VALIDATION_SPLIT))
    if batch_size is None:
        if math.ceil(fit_samples / GUIDE_BATCH) < MIN_STEPS:
            batch_size = SMALL_BATCH
            out(f"Batch size: {batch_size} (the guide's {GUIDE_BATCH} would give "
                f"{math.ceil(fit_samples / GUIDE_BATCH)} step(s) per epoch on {fit_samples:,} "
                "training samples; --batch-size to override)")
        else:
            batch_size = GUIDE_BATCH
            out(f"Batch size: {batch_size} (the guide's)")
    else:
        out(f"Batch size: {batch_size} (--batch-size)")

    runs: dict[str, dict[str, Any]] = {}
    painted: list[str] = []
    for name in ("float32", policy, *([REWRITE] if rewrite else [])):
        out(f"\n== training with {name}: {epochs} epoch(s), validation_split="
            f"{VALIDATION_SPLIT} ==")
        mp.random.set_seed(seed)  # the same initial weights and shuffles for every run
        with mp.policy_scope("float32" if name == REWRITE else name):
            model = build_model(units)
        optimizer: Any = mp.optimizers.RMSprop()
        if name == REWRITE:
            optimizer = mp.mixed_precision.enable_mixed_precision_graph_rewrite(optimizer,
                                                                             lists=lists)
        model.compile(loss="sparse_categorical_crossentropy", optimizer=optimizer,
                      metrics=["accuracy"])
        scales = LossScaleMonitor()
        try:
            history = model.fit(x_train, y_train, batch_size=batch_size, epochs=epochs,
                                validation_split=VALIDATION_SPLIT, verbose=verbose,
                                callbacks=[scales])
            loss, accuracy = model.evaluate(x_test, y_test, batch_size=batch_size, verbose=0)
        finally:
            mp.mixed_precision.disable_mixed_precision_graph_rewrite()
        if name == REWRITE:
            graph = str(model.train_function.graph or "")
            painted = graph.split("\n\n", 1)[1].splitlines() if "\n\n" in graph else []
        times = history.history["time_per_sample"]
        steady = times[1:] or times
        runs[name] = {"test_accuracy": accuracy, "test_loss": loss,
                      "time_per_sample": sum(steady) / len(steady),
                      "history": history.history, "loss_scales": scales.scales,
                      "skipped_at": scales.skipped,
                      "nonfinite": sorted({n for names in scales.nonfinite for n in names}),
                      "skipped_steps": getattr(model.optimizer, "skipped_steps", 0),
                      "dense_dtype": model.get_layer("dense_1").compute_dtype,
                      "output_dtype": model.outputs[0].dtype,
                      "dtype": device_dtype(backend) if name == REWRITE else None,
                      "loss_scaled": isinstance(model.optimizer, mp.LossScaleOptimizer)}
        out(f"{name}: test accuracy {accuracy:.4f}, test loss {loss:.4f}")

    result = {"runs": runs, "units": units, "batch_size": batch_size, "split": data.split,
              "policy": policy}
    where = f"{backend.name} ({device.name})"
    if mp.distribution.world_size() > 1:   # the job of --ranks N
        where += f", {mp.distribution.world_size()} ranks (data-parallel)"
    demo_report.report(result, verdict, where, epochs, painted, out)
    if plot is not None:
        demo_report.plot(result, plot)
        out(f"Plot written to {plot}")
    return result


def inspect(units: int | None = None, policy: str | None = None,
            batch_size: int | None = None, plot: str | None = None, seed: int = 0,
            out: Callable[[str], Any] = print) -> Any:
    """``mpcore demo --inspect``: instead of training, the numerics inspector's report
    (:func:`mpcore.debugging.inspect_numerics`) on the first training batch, for the model the
    demo would train with its mixed policy (``mixed_float8``: with the FP8 view of its GEMM
    operands under the policy's recipe); ``--plot`` draws the report. Returns the report."""
    import mpcore as mp
    from mpcore.datasets import mnist

    _check_arguments(units, policy, 1, batch_size, plot, 0)
    backend = mp.get_backend()
    device = backend.device()
    if policy is None:
        policy, _ = choose_policy(backend, device)
    data = mnist.load()
    units, batch_size = units or 64, min(batch_size or SMALL_BATCH, len(data.x_train))
    out(f"mpcore demo --inspect: the numerics of one step of the guide's model ({units} units, "
        f"{policy}, batch {batch_size}) on {backend.name} ({device.name})")
    x, y = _prepare(data.x_train[:batch_size], data.y_train[:batch_size], backend)
    mp.random.set_seed(seed)
    with mp.policy_scope(policy):
        model = build_model(units)
    model.compile(loss="sparse_categorical_crossentropy", optimizer=mp.optimizers.RMSprop())
    # mixed_float8: the FP8 view of every GEMM operand too, scaled as the policy's recipe would
    recipe = mp.Policy(policy).float8_recipe if policy == "mixed_float8" else None
    report = mp.debugging.inspect_numerics(model, x, y, float8_recipe=recipe)
    out(str(report))
    if recipe is not None:
        out(f"\nFP8 GEMM operands under {recipe!r} (forward operands in "
            f"{recipe.forward_format}, gradients in {recipe.backward_format}): the share of "
            "non-zero values that saturate or flush to zero")
        out(report.float8_table())
    if plot is not None:
        report.plot(plot)
        out(f"Plot written to {plot}")
    return report


def _configure(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--units", type=positive_int, default=None,
                        help="units of the two hidden layers, >= 1 (default: 4096 on a fast "
                             "accelerator, 64 otherwise)")
    parser.add_argument("--policy", choices=MIXED_POLICIES, default=None,
                        help="the mixed policy to compare with float32 (default: the best "
                             "for the device)")
    parser.add_argument("--epochs", type=positive_int, default=5, help=">= 1 (default: 5)")
    parser.add_argument("--batch-size", type=positive_int, default=None,
                        help=">= 1 (default: the guide's 8192, or 128 when that would give "
                             "fewer than 10 steps per epoch)")
    parser.add_argument("--plot", metavar="FILE.png", type=plot_file, default=None,
                        help="draw loss/accuracy per epoch and the loss scale per step "
                             f"(needs matplotlib; formats: {', '.join(PLOT_FORMATS)})")
    parser.add_argument("--inspect", action="store_true",
                        help="instead of training, print the numerics inspector's report on "
                             "one batch (mp.debugging.inspect_numerics); --plot draws it")
    parser.add_argument("--rewrite", action="store_true",
                        help="also train the float32 model with the mixed precision graph "
                             "rewrite, and print its painted training step")
    parser.add_argument("--seed", type=int, default=0, help="any integer (default: 0)")
    parser.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1,
                        help="0 quiet, 1 progress bars (stdout; one line per epoch off a "
                             "terminal), 2 one line per epoch")
    parser.add_argument("--ranks", type=positive_int, default=1,
                        help="train data-parallel on this many ranks under mpiexec, >= 1 "
                             "(default: 1, this process)")


def _job_arguments(args: argparse.Namespace) -> list[str]:
    """The arguments that make each rank run this same demo."""
    argv = ["--epochs", str(args.epochs), "--seed", str(args.seed), "--verbose",
            str(args.verbose), "--ranks", str(args.ranks)]
    for flag, value in (("--units", args.units), ("--policy", args.policy),
                        ("--batch-size", args.batch_size), ("--plot", args.plot)):
        if value is not None:
            argv += [flag, str(value)]
    return argv + ["--rewrite"] * bool(args.rewrite)


def _launch(args: argparse.Namespace) -> int:
    """Run the demo as a job of ``args.ranks`` ranks; its exit status. Each rank's
    collectives have the job's deadline (MPCORE_COLLECTIVE_TIMEOUT), and ``-m mpi4py``
    aborts the job when a rank fails, so this wait ends when the job does."""
    from mpcore.distribution import faults, launch

    try:
        # a bad MPCORE_COLLECTIVE_TIMEOUT or MPCORE_AMP_* edit: one line, not N ranks'
        faults.collective_timeout()
        if args.rewrite:
            from mpcore.amp.lists import AutoMixedPrecisionLists

            AutoMixedPrecisionLists().with_env()
        cmd = launch.command(args.ranks, ["-m", "mpcore", "demo", *_job_arguments(args)])
    except (FileNotFoundError, ValueError) as exc:
        print(f"mpcore demo: {exc}", file=sys.stderr)
        return 1
    cores = usable_cores()
    if args.ranks > cores:
        # allowed (Open MPI is told to oversubscribe: a job can be tried on a laptop), but the
        # ranks then take turns on the cores and wait for each other at every step
        print(f"mpcore demo: warning: --ranks {args.ranks} on {cores} core"
              f"{'s' if cores != 1 else ''}: {args.ranks} processes share them, so every step "
              f"waits for ranks that are not running; the job will be slower than --ranks "
              f"{cores}", file=sys.stderr, flush=True)
    threads = max(1, cores // args.ranks)
    env = {**launch.environment(threads), RANKS_ENV: str(args.ranks)}
    print(f"mpcore demo: {' '.join(cmd)}", flush=True)
    return subprocess.run(cmd, env=env, check=False).returncode


def usable_cores() -> int:
    """The cores this process may run on (its affinity: a container's or taskset's share),
    else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):   # not on every platform
        return max(1, os.cpu_count() or 1)


def _demo(args: argparse.Namespace) -> int:
    import mpcore as mp
    from mpcore.datasets.mnist import MnistFileError, MnistUnavailableError

    if args.inspect:
        return _inspect(args)
    if args.ranks > 1 and RANKS_ENV not in os.environ:
        return _launch(args)
    try:
        mp.get_backend()  # a bad MPCORE_BACKEND, or no backend that works, ends the demo here
        if args.rewrite:  # as bad MPCORE_AMP_* lists: one line, before any training
            mp.mixed_precision.AutoMixedPrecisionLists().with_env()
    except (ValueError, RuntimeError) as exc:
        print(f"mpcore demo: {exc}", file=sys.stderr)
        return 1
    out, plot = print, args.plot
    if args.ranks > 1:
        mp.distribution.set_distribution(mp.distribution.DataParallel())
        if mp.distribution.rank() != 0:
            out, plot = (lambda line: None), None
    try:
        run(units=args.units, policy=args.policy, epochs=args.epochs,
            batch_size=args.batch_size, plot=plot, seed=args.seed, verbose=args.verbose,
            out=out, rewrite=args.rewrite)
    # a corrupt or truncated file is as much the user's to fix as a missing one: one line
    except (MnistUnavailableError, MnistFileError, RuntimeError) as exc:
        if mp.distribution.rank() == 0:  # every rank fails alike: one message
            print(f"mpcore demo: {exc}", file=sys.stderr)
        return 1
    return 0


def _inspect(args: argparse.Namespace) -> int:
    """``mpcore demo --inspect``: one process, no training; says which options it ignores."""
    import mpcore as mp
    from mpcore.datasets.mnist import MnistUnavailableError

    ignored = [f"--{name}" for name, default in (("epochs", 5), ("verbose", 1), ("ranks", 1),
                                                 ("rewrite", False))
               if getattr(args, name) != default]
    if ignored:
        print(f"mpcore demo: --inspect trains nothing: {' and '.join(ignored)} ignored",
              file=sys.stderr)
    try:
        mp.get_backend()
        inspect(units=args.units, policy=args.policy, batch_size=args.batch_size,
                plot=args.plot, seed=args.seed)
    except (MnistUnavailableError, ValueError, RuntimeError) as exc:
        print(f"mpcore demo: {exc}", file=sys.stderr)
        return 1
    return 0


@hookimpl
def mpcore_commands(subcommands: Subcommands) -> None:
    """``mpcore demo``, added through the hook like any plugin's command (entry point
    ``demo`` of the group ``mpcore.commands``)."""
    subcommands.add("demo", "the Keras mixed precision guide on MNIST: float32 vs the best "
                    "mixed policy for this device", _demo, _configure)
