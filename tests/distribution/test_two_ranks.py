"""Two ranks against one process, in real MPI jobs: ``mpiexec -n 2 python -m mpi4py
ranks.py ...`` in a subprocess with a deadline (each rank 1 BLAS thread). The ``train`` job
runs once per session; each test reads what the ranks wrote.

Tolerances: float32, 1e-6 relative to the largest weight (two half-batch gradients averaged
round differently from one full-batch gradient); mixed_float16, 2e-3 (twice float16's 2^-10:
its forward pass rounds each half batch's activations to 10 bits). The two ranks' weights are
compared bit for bit.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import SHARED_MNIST

import mpcore as mp
from mpcore.distribution import launch

HERE = Path(__file__).parent
SCRIPT = HERE / "ranks.py"
DEADLINE_S = 120

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("mpi4py") is None,
    reason='mpi4py is not installed: pip install -e ".[mpi-mpich]" (the test extra has it)')


def _ranks_module() -> Any:
    spec = importlib.util.spec_from_file_location("ranks", SCRIPT)
    module = importlib.util.module_from_spec(spec)  # type: ignore[arg-type]
    spec.loader.exec_module(module)  # type: ignore[union-attr]
    return module


ranks = _ranks_module()


def run_job(scenario: str, out: Path, plain: bool = False, **env: str
            ) -> tuple[subprocess.CompletedProcess[str], float]:
    """``plain``: launched as ``python ranks.py`` (no ``-m mpi4py``)."""
    environment = {**launch.environment(threads=1), "MPCORE_BACKEND": "cpu", **env}
    start = time.monotonic()
    cmd = launch.command(2, [str(SCRIPT), scenario, str(out)])
    if plain:
        cmd.remove("-m")
        cmd.remove("mpi4py")
    proc = subprocess.run(cmd,
                          capture_output=True, text=True, timeout=DEADLINE_S, env=environment,
                          check=False)
    return proc, time.monotonic() - start


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("two_ranks")
    proc, _ = run_job("train", out)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-4000:]
    return out


def load(out: Path, name: str, rank: int) -> tuple[list[np.ndarray], dict[str, Any]]:
    arrays = np.load(out / f"{name}.rank{rank}.npz")
    info = json.loads((out / f"{name}.rank{rank}.json").read_text())
    return [arrays[k] for k in arrays.files], info


def relative(got: list[np.ndarray], want: list[np.ndarray]) -> float:
    return max(float(np.max(np.abs(a - b)) / np.max(np.abs(b))) for a, b in zip(got, want))


def bitwise(a: list[np.ndarray], b: list[np.ndarray]) -> bool:
    return len(a) == len(b) and all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.fixture(autouse=True)
def _cpu() -> Any:
    previous = mp.get_backend().name
    mp.set_backend("cpu")
    yield
    mp.set_backend(previous)


@pytest.mark.parametrize(("name", "policy", "jit", "accumulate"),
                         [run[:4] for run in ranks.RUNS])
def test_two_ranks_with_half_batches_equal_one_process(trained: Path, name: str, policy: str,
                                                      jit: bool, accumulate: int | None) -> None:
    tolerance = 2e-3 if policy == "mixed_float16" else 1e-6
    w0, info0 = load(trained, name, 0)
    w1, info1 = load(trained, name, 1)
    assert bitwise(w0, w1), "the ranks' weights differ"
    for key in ("loss", "accuracy"):  # global means: the same on both ranks
        assert info0["history"][key] == info1["history"][key]
    assert info0["scale"] == info1["scale"]
    model, history = ranks.fit(policy, jit, accumulate)
    assert relative(w0, model.get_weights()) <= tolerance
    assert np.allclose(info0["history"]["loss"], history["loss"], rtol=tolerance)
    assert np.allclose(info0["history"]["accuracy"], history["accuracy"])


def test_a_pure_bfloat16_policy_trains_with_gradients_averaged_in_float32(
        trained: Path) -> None:
    w0, info0 = load(trained, "fit_bfloat16", 0)
    w1, info1 = load(trained, "fit_bfloat16", 1)
    assert bitwise(w0, w1) and info0["history"]["loss"] == info1["history"]["loss"]
    model, history = ranks.fit("bfloat16")
    # bfloat16 keeps 8 bits: two half batches and one whole batch round apart by a few ulps
    want = [w.astype(np.float32) for w in model.get_weights()]
    assert relative(w0, want) <= 2 ** -5
    assert np.allclose(info0["history"]["loss"], history["loss"], rtol=2 ** -5)


def test_shared_memory_buckets_give_the_bits_of_mpis_all_reduce(trained: Path) -> None:
    w0, info0 = load(trained, "fit_float32_allreduce", 0)
    w1, _ = load(trained, "fit_float32_allreduce", 1)
    assert info0["on_one_node"] is True  # so fit_float32 went through shared memory
    assert bitwise(w0, w1)
    assert bitwise(w0, load(trained, "fit_float32", 0)[0])
    for key in ("loss", "accuracy"):
        assert info0["history"][key] == load(trained, "fit_float32", 0)[1]["history"][key]


def test_shared_memory_off_on_one_rank_keeps_every_rank_on_the_all_reduce(
        tmp_path: Path) -> None:
    proc, _ = run_job("shared_off", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    w0, info0 = load(tmp_path, "shared_off", 0)
    w1, info1 = load(tmp_path, "shared_off", 1)
    assert info0["enabled"] is False and info1["enabled"] is False
    assert bitwise(w0, w1)


def test_buckets_of_several_dtypes_sum_the_ranks_weighted_shares(trained: Path) -> None:
    sums0, _ = load(trained, "buckets", 0)
    sums1, _ = load(trained, "buckets", 1)
    assert bitwise(sums0, sums1)
    half = len(sums0) // 2
    shared, allreduce = sums0[:half], sums0[half:]
    assert bitwise(shared, allreduce)
    assert [s.dtype for s in shared] == ["float32", "float32", "float64", "float32", "float32"]
    mine = [[t.numpy() for bucket in ranks.buckets(rank) for t in bucket] for rank in (0, 1)]
    want = [a * a.dtype.type(0.5) + b * b.dtype.type(0.5) for a, b in zip(*mine)]
    assert bitwise(shared, want)


def test_dropout_masks_differ_between_ranks_but_initial_weights_do_not(trained: Path) -> None:
    (mask0, *w0), _ = load(trained, "streams", 0)
    (mask1, *w1), _ = load(trained, "streams", 1)
    assert not np.array_equal(mask0, mask1)
    assert bitwise(w0, w1)


def test_evaluate_takes_rank_0s_weights_as_fit_does(trained: Path) -> None:
    w0, info0 = load(trained, "evaluate", 0)
    w1, info1 = load(trained, "evaluate", 1)
    assert bitwise(w0, w1) and info0["score"] == info1["score"]
    model = ranks.build("float32")
    assert bitwise(w0, model.get_weights())  # rank 0's: rank 1's moved weights are gone
    x, y = ranks.data()
    assert np.allclose(info0["score"], model.evaluate(x, y, batch_size=ranks.BATCH, verbose=0))


def test_a_traced_step_takes_the_same_steps_as_an_eager_one(trained: Path) -> None:
    assert bitwise(load(trained, "fit_float32_jit", 0)[0], load(trained, "fit_float32", 0)[0])


def test_an_inf_in_one_ranks_shard_makes_both_skip_and_halve_the_scale(trained: Path) -> None:
    w0, info0 = load(trained, "custom", 0)
    w1, info1 = load(trained, "custom", 1)
    for info in (info0, info1):
        assert info["applied"] == [True, False, True]
        assert info["scales"] == [1024.0, 512.0, 512.0]
    assert bitwise(w0, w1)
    per_step = len(w0) // 3
    assert bitwise(w0[:per_step], w0[per_step:2 * per_step])  # the skipped step wrote nothing
    # one process on the whole batches, the Inf in the same sample
    x, y = ranks.data()
    steps = []
    for step in range(3):
        xb = x[step * ranks.BATCH:(step + 1) * ranks.BATCH].copy()
        if step == 1:
            xb[ranks.BATCH // 2, 0] = np.inf
        steps.append((xb, y[step * ranks.BATCH:(step + 1) * ranks.BATCH]))
    single = ranks.custom_loop(steps)
    assert single["applied"] == info0["applied"] and single["scales"] == info0["scales"]
    assert relative(w0[-per_step:], single["weights"][-1]) <= 2e-3


def test_a_two_rank_checkpoint_resumes_exactly(trained: Path) -> None:
    w0, info0 = load(trained, "resume", 0)
    w1, _ = load(trained, "resume", 1)
    half = len(w0) // 2
    assert bitwise(w0[:half], w0[half:])  # uninterrupted == restored and continued
    assert bitwise(w0, w1)
    assert info0["files"] == ["resume.ckpt"]  # rank 0 wrote it, once, no temporary left


def test_nccls_unique_id_reaches_every_rank_over_mpi(trained: Path) -> None:
    for rank in (0, 1):
        assert load(trained, "nccl_uid", rank)[0][0].tolist() == list(range(-64, 64))


def test_a_rank_that_raises_ends_the_job_naming_the_rank(tmp_path: Path) -> None:
    proc, elapsed = run_job("raise", tmp_path)
    assert proc.returncode != 0
    assert elapsed < 30
    output = proc.stdout + proc.stderr
    assert "rank 1 fails on purpose" in output and "rank 1" in output


def test_a_rank_that_raises_ends_the_job_without_mpi4py_run_too(tmp_path: Path) -> None:
    # `mpiexec -n 2 python ranks.py`: without the engine's excepthook rank 0 would wait for
    # the whole collective deadline (set far beyond the job's here)
    proc, _ = run_job("raise", tmp_path, plain=True, MPCORE_COLLECTIVE_TIMEOUT="600")
    assert proc.returncode != 0
    assert "rank 1 fails on purpose" in proc.stdout + proc.stderr


def test_a_stuck_rank_ends_the_job_at_the_collective_deadline(tmp_path: Path) -> None:
    proc, elapsed = run_job("stall", tmp_path, MPCORE_COLLECTIVE_TIMEOUT="2")
    assert proc.returncode != 0
    assert elapsed < 30  # rank 1 would sleep for 120 s
    assert "rank 0 of 2: a barrier (the stall test) did not finish within 2 s" in proc.stderr
    assert "MPCORE_COLLECTIVE_TIMEOUT" in proc.stderr


def test_a_rank_stuck_between_two_exchanges_ends_the_job_at_the_deadline(
        tmp_path: Path) -> None:
    proc, elapsed = run_job("stall_buckets", tmp_path, MPCORE_COLLECTIVE_TIMEOUT="2")
    assert proc.returncode != 0
    assert elapsed < 30  # rank 1 would sleep for 120 s
    assert ("rank 0 of 2: a barrier (the gradient buckets (35 float32, 8 float64 values) in "
            "shared memory: written) did not finish within 2 s") in proc.stderr


def test_a_warning_of_every_rank_is_shown_once(tmp_path: Path) -> None:
    proc, _ = run_job("warn", tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (proc.stdout + proc.stderr).count("UserWarning: every rank warns") == 1


def test_ranks_with_different_variables_get_an_error_at_the_first_collective(
        tmp_path: Path) -> None:
    proc, elapsed = run_job("mismatch", tmp_path)
    assert proc.returncode != 0 and elapsed < 30
    assert "DistributionError: the ranks disagree on the model's variables" in proc.stderr
    assert "rank 0: variables=4, values=212" in proc.stderr
    assert "rank 1: variables=4, values=160" in proc.stderr


def test_ranks_with_different_loss_scales_get_an_error_at_the_next_step(
        tmp_path: Path) -> None:
    proc, elapsed = run_job("scale", tmp_path)
    assert proc.returncode != 0 and elapsed < 30
    assert "DistributionError: the ranks disagree on the training state" in proc.stderr
    assert "loss_scale=2048, iterations=0" in proc.stderr
    assert "loss_scale=4096, iterations=0" in proc.stderr


def test_ranks_at_different_calls_are_told_where_each_is(tmp_path: Path) -> None:
    proc, elapsed = run_job("apart", tmp_path)
    assert proc.returncode != 0 and elapsed < 30
    assert "DistributionError: the ranks are at different collectives" in proc.stderr
    # rank 0 is in evaluate, taking rank 0's weights; rank 1 in fit, agreeing on the data
    assert "rank 0: the model's variables at the start of evaluate" in proc.stderr
    assert "rank 1: the data of fit" in proc.stderr


def test_the_graph_rewrite_on_one_rank_only_is_an_error(tmp_path: Path) -> None:
    proc, elapsed = run_job("rewrite", tmp_path)
    assert proc.returncode != 0 and elapsed < 60
    assert "DistributionError: the ranks disagree on the training state" in proc.stderr
    assert re.search(r"rank 1: .*rewrite=0\b", proc.stderr)
    assert not re.search(r"rank 0: .*rewrite=0\b", proc.stderr)


@pytest.mark.skipif(not SHARED_MNIST.is_dir(), reason="the shared MNIST files are not here")
def test_the_demo_runs_on_two_ranks() -> None:
    env = {**launch.environment(), "MPCORE_DATA_DIR": str(SHARED_MNIST), "MPCORE_BACKEND": "cpu"}
    proc = subprocess.run([sys.executable, "-m", "mpcore", "demo", "--ranks", "2", "--epochs",
                           "1", "--units", "16", "--verbose", "0"], capture_output=True,
                          text=True, timeout=DEADLINE_S, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "-m mpi4py -m mpcore demo --epochs 1" in proc.stdout
    assert proc.stdout.count("Results on cpu") == 1  # rank 0 prints, rank 1 does not
    assert "2 ranks (data-parallel), 16 units" in proc.stdout
