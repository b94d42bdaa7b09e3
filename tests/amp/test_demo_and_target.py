"""`mpcore demo --rewrite` (the rewritten run and its painted step next to float32 and the
mixed policy), and the choice of the 16-bit dtype from the device's verdicts (a pure
function, tested for devices that are not here)."""

from __future__ import annotations

import logging

import pytest
from amp_models import MNIST, needs_mnist, rewrite_off  # noqa: F401 - autouse

import mpcore as mp
from mpcore.amp import rewrite, target
from mpcore.amp.target import choose_dtype
from mpcore.cli import app as cli
from mpcore.mixed_precision.verdict import Verdict


@needs_mnist
def test_demo_rewrite_prints_the_painted_step(monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("MPCORE_DATA_DIR", str(MNIST))
    assert cli.main(["demo", "--rewrite", "--epochs", "1", "--units", "16", "--verbose",
                     "0"]) == 0
    out = capsys.readouterr().out
    table = out[out.index("Results on"):].splitlines()
    policy = out.split("Mixed policy: ")[1].split()[0]
    assert {line.split()[0] for line in table[2:5]} == {"float32", policy, "float32+rewrite"}
    assert "The float32+rewrite training step, as traced" in out
    # the first op: the fused dense where the backend has that kernel, else its matmul; in
    # the device's 16-bit dtype (bfloat16 on a CPU)
    first = "dense" if "dense" in mp.get_backend().kernels() else "matmul"
    dtype = out.split("float32+rewrite (")[1].split(")")[0]
    assert f"{first}#0() -> {dtype}  [allowlist: {first} is on the allowlist]" in out
    assert "[denylist: softmax is on the denylist]" in out
    # the demo leaves neither the rewrite nor a policy behind
    assert not rewrite.is_enabled() and mp.global_policy().name == "float32"


def _verdict(policy: str, fast: bool, supported: bool = True, device: str = "dev") -> Verdict:
    return Verdict(policy, "be", device, supported, fast, f"{policy} reason")


@pytest.mark.parametrize("f16, bf16, expected", [
    ((True, True), (True, True), "float16"),      # a V100/A100: fp16 tensor cores
    ((False, True), (True, True), "bfloat16"),    # a CPU with avx512_bf16 or AMX
    ((False, True), (False, True), "bfloat16"),   # neither fast: bfloat16, said why
    ((False, True), (False, False), "float16"),   # only float16 runs (slowly)
])
def test_the_dtype_follows_the_verdicts(f16: tuple[bool, bool], bf16: tuple[bool, bool],
                                        expected: str) -> None:
    dtype, why = choose_dtype(_verdict("mixed_float16", *f16), _verdict("mixed_bfloat16", *bf16))
    assert dtype == expected
    fast = f16[0] if expected == "float16" else bf16[0]
    assert (why is None) == fast
    if why is not None:
        assert "neither 16-bit dtype is fast on be (dev)" in why and "reason" in why


def test_no_16_bit_dtype_at_all_is_an_error() -> None:
    with pytest.raises(ValueError, match="supports neither 16-bit dtype"):
        choose_dtype(_verdict("mixed_float16", False, False),
                     _verdict("mixed_bfloat16", False, False))


def test_this_cpu_gets_its_fast_dtype_and_a_slow_device_says_why_once(
        monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture) -> None:
    cpu = mp.get_backend("cpu")
    f16, bf16 = mp.check_policy("mixed_float16", cpu), mp.check_policy("mixed_bfloat16", cpu)
    assert target.device_dtype(cpu) == choose_dtype(f16, bf16)[0]
    if bf16.fast:
        assert target.device_dtype(cpu) == "bfloat16"

    class Slow(type(cpu)):  # type: ignore[misc]
        name = "slow-cpu"

        def policy_support(self, policy: str, device: object) -> object:
            support = super().policy_support(policy, device)
            return type(support)(support.supported, False, "emulated here")

    monkeypatch.setattr(target, "_chosen", {})
    with caplog.at_level(logging.WARNING, logger="mpcore"):
        assert target.device_dtype(Slow()) == "bfloat16"
        assert target.device_dtype(Slow()) == "bfloat16"
    # (the real cpu's own warning, above, where neither dtype is fast on it, is not counted)
    messages = [r.getMessage() for r in caplog.records
                if "neither 16-bit dtype is fast on slow-cpu" in r.getMessage()]
    assert len(messages) == 1 and "emulated here" in messages[0]


def test_demo_rewrite_checks_the_lists_before_training(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Issue 18, defect 7: a bad MPCORE_AMP_* edit was a raw traceback after two runs had
    trained; now one line naming the variable, before anything trains (no data needed)."""
    monkeypatch.setenv("MPCORE_AMP_ALLOWLIST_ADD", "foo")
    assert cli.main(["demo", "--rewrite", "--epochs", "1", "--verbose", "0"]) == 1
    captured = capsys.readouterr()
    assert "training" not in captured.out
    assert captured.err.startswith("mpcore demo: MPCORE_AMP_ALLOWLIST_ADD: unknown op name(s) "
                                   "'foo'; valid names:")
    assert len(captured.err.strip().splitlines()) == 1
    with pytest.raises(ValueError, match=r"MPCORE_AMP_ALLOWLIST_ADD"):   # run() checks too
        from mpcore.cli import demo
        demo.run(rewrite=True, out=lambda line: None)


def _result(epochs: int = 1) -> dict[str, object]:
    def run(scaled: bool, dtype: str | None = None) -> dict[str, object]:
        return {"test_accuracy": 0.9, "time_per_sample": 1e-5, "loss_scales": [32768.0] * 4,
                "skipped_at": [2] if scaled else [], "nonfinite": [], "skipped_steps": 1,
                "history": {"loss": [1.0] * epochs, "accuracy": [0.5] * epochs},
                "loss_scaled": scaled, "dtype": dtype}
    return {"runs": {"float32": run(False), "mixed_bfloat16": run(False),
                     "float32+rewrite": run(True, "bfloat16")},
            "policy": "mixed_bfloat16", "units": 16, "batch_size": 128, "split": "offline"}


def test_demo_report_covers_the_rewrite_run_and_is_honest_about_speed() -> None:
    """Issue 18, defects 13 and 14: the rewrite run's loss scale and skipped steps were left
    out, its row did not say its dtype, and speed ratios were printed as if exact next to a
    "not fast" verdict."""
    from mpcore.cli import demo_report

    lines: list[str] = []
    verdict = _verdict("mixed_bfloat16", False)
    demo_report.report(_result(), verdict, "cpu (dev)", 1, [], lines.append)
    text = "\n".join(lines)
    assert any(line.startswith("float32+rewrite (bfloat16) ") for line in lines)
    assert "float32+rewrite (bfloat16) skipped 1 step(s)" in text and "final loss scale" in text
    assert "mixed_bfloat16 skipped" not in text          # no loss scale: nothing to say
    assert "vary from run to run" in text
    assert "the backend's verdict, from the hardware and not from these timings" in text


@pytest.mark.parametrize("mixed_time, said", [(2e-5, True), (1e-5, False), (5e-6, False)])
def test_demo_report_explains_a_fast_verdict_beside_a_slower_mixed_run(
        mixed_time: float, said: bool) -> None:
    """A "fast" verdict next to a mixed run slower than float32 (the README's demo at 64 units
    on a CPU with avx512_bf16) is explained, not left as a contradiction; an equal or faster
    run needs no note."""
    from mpcore.cli import demo_report

    result = _result()
    result["runs"]["mixed_bfloat16"]["time_per_sample"] = mixed_time  # type: ignore[index]
    lines: list[str] = []
    demo_report.report(result, _verdict("mixed_bfloat16", True), "cpu (dev)", 5, [],
                       lines.append)
    notes = [line for line in lines if line.startswith("Note: ")]
    assert notes == ([
        "Note: mixed_bfloat16 ran slower than float32 here, though the backend's verdict is "
        "that it is fast on this hardware. The verdict is about 16-bit matrix products; at 16 "
        "units they are too small to repay the casts to and from 16-bit that mixed precision "
        "adds to every step. A larger --units (1024, say) shows where it pays."] if said else [])


def test_demo_plot_draws_every_loss_scale_and_whole_epochs(
        tmp_path: object, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 18, defect 13: the plot said "no loss scaling" for a bfloat16 policy though the
    rewrite run had a dynamic loss scale; one epoch gave an axis of 0.945..1.05."""
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    from mpcore.cli import demo_report

    figures: list[object] = []
    monkeypatch.setattr(plt, "close", figures.append)
    demo_report.plot(_result(epochs=1), str(tmp_path) + "/p.png")
    (fig,) = figures
    loss_ax, _, scale_ax = fig.axes  # type: ignore[attr-defined]
    assert list(loss_ax.get_xticks()) == [1]
    assert scale_ax.get_lines()[0].get_label() == "float32+rewrite (bfloat16)"
    monkeypatch.undo()
    plt.close(fig)
