"""mp.distribution in one process: the API without a distribution, the engine choice, the
bucket plan, the batch split, the deadline setting, the disagreement errors, the launch line
and the NCCL engine's bootstrap and dtype mapping (as functions: no GPU here). The jobs of
several ranks are in test_two_ranks.py."""

from __future__ import annotations

import itertools
import logging
import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from mpcore_nccl import bootstrap

import mpcore as mp
from mpcore.distribution import collectives, faults, gradients, launch, sharding


def backend(name: str) -> mp.Backend:
    return next(b for b in mp.backends() if b.name == name)


def test_import_mpcore_imports_no_engine() -> None:
    code = ("import sys, mpcore as mp; mp.distribution; mp.get_backend(); "
            "print('mpi4py' in sys.modules, 'cupy.cuda.nccl' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         timeout=120, check=True, env=launch.environment()).stdout
    assert out.split() == ["False", "False"]


def test_without_a_distribution_one_process_trains_alone() -> None:
    assert mp.distribution.distribution() is None
    assert (mp.distribution.rank(), mp.distribution.world_size()) == (0, 1)
    assert sharding.shard(3, 11, train=True) == (3, 11)
    assert sharding.verbosity(2) == 2


def test_a_ranks_stream_changes_dropout_masks_but_not_shared_draws() -> None:
    from mpcore.core import random as _random

    def draw(stream: int) -> tuple[list[float], list[float], int]:
        _random.set_seed(5)
        _random.set_stream(stream)
        try:
            mask = mp.ops.dropout_mask((64,), 0.5).numpy().tolist()
            with _random.shared():
                init = mp.ops.random_uniform((8,)).numpy().tolist()
        finally:
            _random.set_stream(0)
        return mask, init, _random.get_state()["counter"]

    alone, rank1 = draw(0), draw(1)
    assert alone[0] != rank1[0]  # independent masks over the global batch
    assert alone[1:] == rank1[1:]  # the same weights, and the counter the ranks check
    with pytest.raises(ValueError, match="stream must be an int >= 0, got -1"):
        _random.set_stream(-1)


def test_set_distribution_takes_a_distribution_or_none() -> None:
    with pytest.raises(TypeError, match="DataParallel or None, got str"):
        mp.distribution.set_distribution("mpi")  # type: ignore[arg-type]
    mp.distribution.set_distribution(None)
    assert mp.distribution.distribution() is None


def test_the_engines_come_from_the_hook_and_are_chosen_by_backend() -> None:
    found = collectives.engines()
    assert {"mpi", "nccl"} <= set(found)
    cpu = backend("cpu")
    if found["mpi"].unavailable_reason(cpu) is None:
        assert collectives.choose(None, cpu).name == "mpi"  # NCCL cannot take host arrays
    with pytest.raises(ValueError, match=r"unknown collectives engine 'gloo'; valid: .*mpi"):
        collectives.choose("gloo", cpu)
    with pytest.raises(mp.distribution.DistributionError,
                       match=r"nccl: NCCL reduces CUDA arrays; the backend is 'cpu'$"):
        collectives.choose("nccl", cpu)  # and no hint about installing MPI


def test_reductions_are_named() -> None:
    assert collectives.check_reduction("min") == "min"
    with pytest.raises(ValueError, match="unknown reduction 'mean'; valid: sum, min, max"):
        collectives.check_reduction("mean")


def test_buckets_follow_the_variables_and_split_at_the_size_and_dtype() -> None:
    shapes = [(784, 1024), (1024,), (1024, 1024), (1024,), (1024, 10), (10,)]
    layout = gradients.plan(shapes, ["float32"] * 6, [4] * 6, 4 << 20)
    # W1+b1 fit 4 MiB; W2 (4 MiB) travels alone; the rest share one buffer
    assert layout.buckets == ((0, 1), (2,), (3, 4, 5))
    assert layout.count == 6 and layout.values == sum(math.prod(s) for s in shapes)
    mixed = gradients.plan([(2,), (2,), (2,)], ["float32", "float64", "float64"], [4, 8, 8],
                           1 << 20)
    assert mixed.buckets == ((0,), (1, 2))


def test_16_bit_gradients_are_averaged_in_float32() -> None:
    assert gradients.wire_dtype("bfloat16") == gradients.wire_dtype("float16") == "float32"
    assert gradients.wire_dtype("float64") == "float64"
    assert gradients.wire_dtype("float32") == "float32"


def test_the_layout_signature_tells_shapes_and_dtypes_apart() -> None:
    base = faults.signature([(3, 4), (4,)], ["float32", "float32"])
    assert base == faults.signature([(3, 4), (4,)], ["float32", "float32"])
    assert base != faults.signature([(4, 3), (4,)], ["float32", "float32"])
    assert base != faults.signature([(3, 4), (4,)], ["float32", "float64"])
    assert base == int(base) and base < 2 ** 52  # exact in a float64


@given(st.integers(0, 1000), st.integers(1, 500), st.integers(1, 8))
def test_shards_cover_each_row_of_a_batch_once(lo: int, n: int, size: int) -> None:
    spans = [sharding.rows_of(lo, lo + n, r, size) for r in range(size)]
    assert spans[0][0] == lo and spans[-1][1] == lo + n
    assert all(a[1] == b[0] for a, b in itertools.pairwise(spans))
    lengths = [stop - start for start, stop in spans]
    assert max(lengths) - min(lengths) <= 1


def test_a_last_batch_smaller_than_the_ranks_is_left_out_with_a_warning(
        caplog: pytest.LogCaptureFixture) -> None:
    assert sharding.count_batches(100, 32, 1, 0, "fit") == 4
    assert sharding.count_batches(100, 32, 4, 0, "fit") == 4  # 4 rows left: one a rank
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        assert sharding.count_batches(97, 32, 4, 0, "fit") == 3
    assert "the last batch of 1 sample(s) is smaller than the number of ranks (4)" in (
        caplog.text)
    with pytest.raises(ValueError, match="needs batch_size and the number of samples >= 4"):
        sharding.count_batches(3, 2, 4, 0, "fit")


@pytest.mark.parametrize(("n", "batch_size"), [(8, 1), (9, 1), (100, 3)])
def test_a_batch_size_below_the_number_of_ranks_is_an_error(n: int, batch_size: int) -> None:
    # batch_size=1 on 2 ranks used to give NaN: one rank had an empty shard at every step
    with pytest.raises(ValueError, match=f"got batch_size={batch_size}, {n} samples"):
        sharding.count_batches(n, batch_size, 4 if batch_size == 3 else 2, 0, "fit")
    assert sharding.count_batches(n, batch_size, 1, 0, "fit") == -(-n // batch_size)


def test_the_collective_deadline_is_a_positive_number_of_seconds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(faults.TIMEOUT_ENV, raising=False)
    assert faults.collective_timeout() == faults.DEFAULT_TIMEOUT_S
    monkeypatch.setenv(faults.TIMEOUT_ENV, "2.5")
    assert faults.collective_timeout() == 2.5
    for bad in ("0", "-1", "soon", "inf", "nan"):
        monkeypatch.setenv(faults.TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match="MPCORE_COLLECTIVE_TIMEOUT must be a finite "
                                             "number of seconds > 0"):
            faults.collective_timeout()


def test_a_disagreement_names_every_ranks_values() -> None:
    assert faults.disagreement("x", [[1.0, 2.0], [1.0, 2.0]], ("a", "b")) is None
    error = faults.disagreement("the step", [[1.0, 7.0], [1.0, 8.5]], ("scale", "step"))
    assert isinstance(error, mp.distribution.DistributionError)
    assert str(error) == ("the ranks disagree on the step:\n  rank 0: scale=1, step=7\n"
                          "  rank 1: scale=1, step=8.5")


def test_the_launch_line_runs_python_under_mpi4py() -> None:
    try:
        cmd = launch.command(2, ["train.py", "--fast"])
    except FileNotFoundError as exc:
        pytest.skip(str(exc))
    assert cmd[1:] == ["-n", "2", sys.executable, "-m", "mpi4py", "train.py", "--fast"]
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="ranks must be a whole number >= 1"):
            launch.command(bad, ["x.py"])  # type: ignore[arg-type]
    env = launch.environment(threads=1)
    assert env["OMP_NUM_THREADS"] == "1" and env["OMPI_ALLOW_RUN_AS_ROOT"] == "1"


def test_nccl_dtypes_and_reductions_are_the_nccl_enums() -> None:
    assert bootstrap.nccl_dtype("float32") == 7 and bootstrap.nccl_dtype("bfloat16") == 9
    assert bootstrap.nccl_op("sum") == 0 and bootstrap.nccl_op("min") == 3
    with pytest.raises(ValueError, match="NCCL cannot reduce 'bool' tensors; valid dtypes: "
                                         "int8, uint8"):
        bootstrap.nccl_dtype("bool")
    with pytest.raises(ValueError, match="unknown reduction 'prod'; valid: sum, max, min"):
        bootstrap.nccl_op("prod")
    nccl = pytest.importorskip("cupy.cuda.nccl")
    if not nccl.available:
        pytest.skip("CuPy finds no NCCL library here (nvidia-nccl-cu12): the enums are "
                    "checked against NCCL's C header values only")
    assert bootstrap.nccl_dtype("float16") == nccl.NCCL_FLOAT16
    assert bootstrap.nccl_dtype("float32") == nccl.NCCL_FLOAT32
    assert bootstrap.nccl_dtype("float64") == nccl.NCCL_FLOAT64
    assert bootstrap.nccl_dtype("int64") == nccl.NCCL_INT64
    assert bootstrap.nccl_op("max") == nccl.NCCL_MAX and bootstrap.nccl_op("min") == nccl.NCCL_MIN


@given(st.lists(st.integers(-128, 127), min_size=128, max_size=128))
def test_an_nccl_unique_id_survives_its_trip_as_floats(uid: list[int]) -> None:
    values = bootstrap.encode_unique_id(uid)
    assert all(0.0 <= v <= 255.0 for v in values)
    assert bootstrap.decode_unique_id(values) == tuple(uid)


def test_an_nccl_unique_id_has_128_bytes() -> None:
    with pytest.raises(ValueError, match="an NCCL unique id has 128 bytes, got 3"):
        bootstrap.encode_unique_id([1, 2, 3])
    got = bootstrap.share_unique_id(0, lambda: tuple(range(128)), lambda v: list(v))
    assert got == tuple(range(128))  # one rank: its own id


def test_the_nccl_engine_says_why_it_cannot_run_here() -> None:
    reason = collectives.engines()["nccl"].unavailable_reason(backend("cpu"))
    assert reason == "NCCL reduces CUDA arrays; the backend is 'cpu'"


@pytest.mark.gpu
def test_nccl_all_reduce_on_a_gpu() -> None:
    cuda = backend("cuda")
    if not cuda.is_available():
        pytest.skip(f"no CUDA GPU here: {cuda.unavailable_reason()}")
    reason = collectives.engines()["nccl"].unavailable_reason(cuda)
    if reason is not None:
        pytest.skip(reason)
    engine = collectives.engines()["nccl"](None, 30.0)  # a world of one rank
    x = mp.constant([1.0, 2.0, 3.0], backend="cuda")
    assert engine.allreduce(x, "sum").numpy().tolist() == [1.0, 2.0, 3.0]


class _TwoRanks:
    """A stand-in for a 2-rank distribution: rank 1 sends ``other`` at the same control point
    (or at the point ``elsewhere``)."""

    rank, world_size = 0, 2

    def __init__(self, other: list[float] | None = None, elsewhere: str | None = None) -> None:
        self.other, self.elsewhere = other, elsewhere
        self.engine = self

    def allgather_values(self, values: list[float], what: str | None = None
                         ) -> list[list[float]]:
        from mpcore.distribution import faults

        row = list(values)
        if self.other is not None:
            row = [row[0], *self.other] + [0.0] * (faults.CONTROL_WIDTH - 1 - len(self.other))
        if self.elsewhere is not None:
            faults.known(self.elsewhere)
            row[0] = faults.digest(self.elsewhere)
        return [list(values), row]


def test_ranks_at_different_collectives_are_told_where_each_is(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # `if rank() == 0: model.evaluate(...)`, then fit on both: MPI would pair rank 0's
    # evaluate with rank 1's fit and each would read the other's numbers as its own
    elsewhere = "the data of fit (every rank passes the same number of samples and the " \
                "same batch_size: it is global)"
    monkeypatch.setattr(sharding._api, "distribution", lambda: _TwoRanks(elsewhere=elsewhere))
    with pytest.raises(mp.distribution.DistributionError) as info:
        sharding.plan("evaluate", 64, 16)
    text = str(info.value)
    assert "the ranks are at different collectives" in text
    assert "rank 0: the data of evaluate" in text and "rank 1: the data of fit" in text


def test_ranks_with_other_data_are_told_each_ranks_values_before_the_first_step(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # 2048 vs 2000 samples at batch_size=256: the same 8 steps, which used to train silently
    monkeypatch.setattr(sharding._api, "distribution", lambda: _TwoRanks([2000, 256, 8, 0, 1]))
    with pytest.raises(mp.distribution.DistributionError) as info:
        sharding.plan("fit", 2048, 256)
    assert "the ranks disagree on the data of fit" in str(info.value)
    assert "rank 0: samples=2048, batch_size=256, steps=8" in str(info.value)
    assert "rank 1: samples=2000, batch_size=256, steps=8" in str(info.value)


def test_validation_data_smaller_than_the_ranks_is_an_error_before_training(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sharding._api, "distribution", lambda: _TwoRanks())
    monkeypatch.setattr(sharding._api, "world_size", lambda: 2)
    with pytest.raises(ValueError, match=r"fit's validation data \(validation_data or "
                                         r"validation_split\) under a distribution of 2 ranks"):
        sharding.plan("fit", 64, 16, validation_samples=1)
    assert sharding.plan("fit", 64, 16, validation_samples=2) == 4


def test_only_rank_0_logs_and_prints(monkeypatch: pytest.MonkeyPatch,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    from mpcore.distribution import api

    def record(level: int) -> logging.LogRecord:
        return logging.LogRecord("mpcore", level, __file__, 1, "notice", None, None)

    inputs = mp.Input(shape=(2,))
    model = mp.Model(inputs=inputs, outputs=mp.layers.Dense(1)(inputs))
    monkeypatch.setattr(api, "rank", lambda: 1)
    assert not api.RankZeroFilter().filter(record(logging.WARNING))
    assert api.RankZeroFilter().filter(record(logging.ERROR))  # a rank's own failure
    model.predict([[1.0, 2.0]], verbose=1)
    assert capsys.readouterr().out == ""
    monkeypatch.setattr(api, "rank", lambda: 0)
    assert api.RankZeroFilter().filter(record(logging.WARNING))
    model.predict([[1.0, 2.0]], verbose=1)
    assert capsys.readouterr().out.startswith("1/1 - ")


def test_a_save_on_rank_0_alone_is_named_in_the_barriers_timeout(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # `if rank() == 0: model.save_weights(p)` leaves rank 0 in this barrier until the
    # deadline: its name (printed with the timeout) says what to do instead
    from mpcore.checkpoint import checkpoint

    waits: list[str | None] = []

    class Rank0:
        rank = 0

        class engine:  # noqa: N801 - stands in for an attribute
            @staticmethod
            def allgather_values(values: list[float], what: str | None = None
                                 ) -> list[list[float]]:
                waits.append(what)
                return [list(values), list(values)]

    monkeypatch.setattr(checkpoint._distribution, "distribution", lambda: Rank0())
    checkpoint.atomic_write(tmp_path / "w.ckpt", {"x": 1})
    assert (tmp_path / "w.ckpt").is_file()
    assert waits == [f"rank 0 writing {tmp_path / 'w.ckpt'}; under a distribution every rank "
                     "calls save_weights/save_checkpoint, not rank 0 alone"]


def test_warnings_are_shown_by_rank_0_alone_and_raised_on_every_rank(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from mpcore.distribution import api

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        api.show_warnings_on_rank_zero()
        api.show_warnings_on_rank_zero()  # wraps once
        monkeypatch.setattr(api, "rank", lambda: 1)
        warnings.warn("on rank 1", UserWarning, stacklevel=1)
        assert seen == []
        warnings.simplefilter("error")  # a warning made an error still raises on rank 1
        with pytest.raises(UserWarning, match="an error on rank 1"):
            warnings.warn("an error on rank 1", UserWarning, stacklevel=1)
        warnings.simplefilter("always")
        monkeypatch.setattr(api, "rank", lambda: 0)
        warnings.warn("on rank 0", UserWarning, stacklevel=1)
    assert [str(w.message) for w in seen] == ["on rank 0"]
