"""`mpcore demo`: its output (compatibility check, device, data split, table) and its plot."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SHARED_MNIST

from mpcore.cli import app as cli
from mpcore.cli import demo

SHARED = SHARED_MNIST
pytestmark = pytest.mark.skipif(not SHARED.is_dir(), reason="the shared MNIST files are not here")


@pytest.fixture(autouse=True)
def offline_data(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MPCORE_DATA_DIR", str(SHARED))


def test_demo_output(capsys: pytest.CaptureFixture[str]) -> None:
    import mpcore as mp

    assert cli.main(["demo", "--epochs", "2", "--verbose", "0"]) == 0
    out = capsys.readouterr().out
    policy, why = demo.choose_policy(mp.get_backend())  # see tests/cli/test_demo_setup.py
    assert f"Mixed precision compatibility check ({policy})" in out
    assert f"Mixed policy: {policy} ({why})" in out
    assert "Device: " in out and f"Backend: {mp.get_backend().name}" in out
    assert "Units: 64" in out
    assert "OFFLINE SPLIT" in out and "8,000" in out
    assert "Batch size: 128 (the guide's 8192 would give 1 step(s)" in out
    table = out[out.index("Results on"):].splitlines()
    assert table[1].split() == ["policy", "test", "accuracy", "time/sample", "speed", "vs",
                                "float32"]
    rows = {line.split()[0]: line.split() for line in table[2:4]}
    assert set(rows) == {"float32", policy}
    assert rows["float32"][-1] == "1.00x"
    assert "time/sample: epoch 2 (epoch 1 holds the warm-up)" in out
    for row in rows.values():
        assert 0.8 < float(row[1]) <= 1.0


def test_demo_policy_units_and_plot(tmp_path: Path) -> None:
    plot = tmp_path / "demo.png"
    lines: list[str] = []
    result = demo.run(units=32, policy="mixed_float16", epochs=1, batch_size=256,
                      plot=str(plot), verbose=0, out=lines.append)
    text = "\n".join(lines)
    assert "Mixed policy: mixed_float16 (chosen with --policy)" in text
    assert "Units: 32 (--units)" in text and "Batch size: 256 (--batch-size)" in text
    assert "skipped" in text and "final loss scale" in text
    # one epoch: the time per sample includes warm-up (OpenCL compiles its kernels then), so
    # the speed ratio is not a steady-state figure, and the demo says so
    assert "include warm-up" in text
    mixed = result["runs"]["mixed_float16"]
    assert mixed["dense_dtype"] == "float16" and mixed["output_dtype"] == "float32"
    assert len(mixed["loss_scales"]) == 25  # 6,400 samples / 256 per step
    assert plot.stat().st_size > 10_000 and plot.read_bytes()[:4] == b"\x89PNG"


def test_demo_mixed_float8(capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 35: the demo trains the guide's model with FP8 GEMMs against float32; the
    10-wide output layer stays in mixed_bfloat16, the hidden ones keep their FP8 scales."""
    assert cli.main(["demo", "--policy", "mixed_float8", "--units", "32", "--epochs", "2",
                     "--batch-size", "256", "--verbose", "0"]) == 0
    out = capsys.readouterr().out
    assert "Mixed policy: mixed_float8 (chosen with --policy)" in out
    assert "Mixed precision compatibility check (mixed_float8)" in out
    table = out[out.index("Results on"):].splitlines()
    rows = {line.split()[0]: line.split() for line in table[2:4]}
    assert set(rows) == {"float32", "mixed_float8"}
    # 2 epochs of 25 steps: both well past chance, FP8 within a few points of float32
    assert 0.7 < float(rows["mixed_float8"][1]) <= 1.0
    assert abs(float(rows["mixed_float8"][1]) - float(rows["float32"][1])) < 0.05
    assert "that mixed_float8 is not fast here: FP8 is emulated" in out


def test_demo_builds_the_fp8_model_with_a_bfloat16_output_layer() -> None:
    import mpcore as mp

    with mp.policy_scope("mixed_float8"):
        model = demo.build_model(16)
    policies = {la.name: la.dtype_policy.name for la in model.layers
                if isinstance(la, mp.layers.Dense)}
    assert policies == {"dense_1": "mixed_float8", "dense_2": "mixed_float8",
                        "dense_logits": "mixed_bfloat16"}
    assert hasattr(model.get_layer("dense_1"), "inputs_scale")
    assert not hasattr(model.get_layer("dense_logits"), "inputs_scale")


def test_demo_rejects_bad_arguments(capsys: pytest.CaptureFixture[str]) -> None:
    # every argument in detail: tests/cli/test_demo_setup.py
    for args, message in ((["--policy", "float8"], "invalid choice"),
                          (["--epochs", "0"], "argument --epochs: must be a whole number >= 1")):
        with pytest.raises(SystemExit) as info:
            cli.main(["demo", *args])
        assert info.value.code == 2 and message in capsys.readouterr().err


def test_demo_inspect(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    plot = tmp_path / "numerics.png"
    assert cli.main(["demo", "--inspect", "--policy", "mixed_float16", "--units", "16",
                     "--plot", str(plot)]) == 0
    out = capsys.readouterr().out
    assert "mpcore demo --inspect: the numerics of one step of the guide's model (16 units, " \
           "mixed_float16, batch 128)" in out
    assert "First op to produce Inf/NaN: none" in out
    for layer in ("dense_1", "dense_2", "dense_logits"):
        assert layer in out
    assert "Results on" not in out              # it inspects instead of training
    assert plot.read_bytes()[:4] == b"\x89PNG"


def test_demo_inspect_says_what_it_ignores(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--inspect", "--units", "8", "--batch-size", "100000",
                     "--epochs", "3"]) == 0
    captured = capsys.readouterr()
    assert "batch 8000)" in captured.out       # all the offline split has, as the report says
    assert "(batch 8000, " in captured.out
    assert "--inspect trains nothing: --epochs ignored" in captured.err


def test_demo_inspect_of_mixed_float8_shows_the_fp8_gemm_operands(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["demo", "--inspect", "--policy", "mixed_float8", "--units", "16"]) == 0
    out = capsys.readouterr().out
    assert "FP8 GEMM operands under CurrentScaling(" in out
    assert "forward  dense_1" in out and "float8_e5m2" in out
    assert "most affected: " in out
