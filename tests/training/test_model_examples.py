"""examples/resnet.py and examples/transformer_lm.py: a few steps of each, as the scripts run
(fast), and, marked slow, each trained to its stated bar with float32 and mixed_bfloat16
(mixed within 2 points of accuracy, or 2% of loss, of float32)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from typing import Any

import pytest
from conftest import REPO_ROOT, SHARED_MNIST

import mpcore as mp

EXAMPLES = REPO_ROOT / "examples"
NEEDED = {"resnet.py": ("BatchNormalization", "GlobalAveragePooling2D", "add"),
          "transformer_lm.py": ("Embedding", "MultiHeadAttention", "add")}


def run_example(script: str, *args: str, timeout: int = 120) -> tuple[dict[str, Any], str]:
    """The example's last JSON line and its whole output; skips where the layers it needs are
    not in this tree yet, or MNIST's shared files are missing."""
    missing = [n for n in NEEDED[script] if not hasattr(mp.layers, n)]
    if missing:
        pytest.skip(f"mp.layers lacks {', '.join(missing)}")
    env = dict(os.environ)
    if script == "resnet.py":
        if not SHARED_MNIST.is_dir():
            pytest.skip(f"no shared MNIST files at {SHARED_MNIST}")
        env["MPCORE_DATA_DIR"] = str(SHARED_MNIST)
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), *args], capture_output=True,
                          text=True, env=env, timeout=timeout, cwd=REPO_ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    last = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")][-1]
    return json.loads(last), proc.stdout


@pytest.mark.parametrize(("policy", "jit"), [("float32", "--no-jit"),
                                             ("mixed_bfloat16", "--jit")])
def test_resnet_example_runs(policy: str, jit: str) -> None:
    result, out = run_example("resnet.py", "--policy", policy, jit, "--epochs", "1",
                              "--train-limit", "128", "--test-limit", "64", "--batch-size", "32",
                              "--blocks", "1", "--verbose", "0")
    assert result["example"] == "resnet" and result["policy"] == policy
    assert result["jit"] is (jit == "--jit")
    assert 0.0 <= result["test_accuracy"] <= 1.0
    assert "Test accuracy:" in out and "parameters" in out


def test_resnet_example_rejects_bad_sizes() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "resnet.py"), "--blocks", "0"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2 and "--blocks must be >= 1" in proc.stderr


@pytest.mark.parametrize("policy", ["float32", "mixed_bfloat16"])
def test_transformer_example_runs(policy: str) -> None:
    result, out = run_example("transformer_lm.py", "--policy", policy, "--epochs", "1",
                              "--max-chars", "20000", "--seq-len", "16", "--d-model", "16",
                              "--heads", "2", "--layers", "1", "--generate", "12",
                              "--verbose", "0")
    assert result["example"] == "transformer_lm" and result["policy"] == policy
    assert 0.0 < result["val_loss"] < 10.0
    assert "Validation loss:" in out
    generated = out.split("--- generated ---\n")[1].split("\n---")[0]
    assert len(generated) == 12


def test_transformer_example_rejects_bad_heads() -> None:
    proc = subprocess.run([sys.executable, str(EXAMPLES / "transformer_lm.py"), "--d-model",
                           "30", "--heads", "4"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2 and "multiple of --heads" in proc.stderr



@pytest.mark.parametrize("script", ["resnet.py", "transformer_lm.py"])
def test_example_help_gives_the_whole_first_paragraph(script: str) -> None:
    """``--help`` described the transformer by its docstring's first line, a sentence cut off
    at "character by character, with"."""
    proc = subprocess.run([sys.executable, str(EXAMPLES / script), "--help"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    first = (EXAMPLES / script).read_text().split('"""')[1].split("\n\n")[0]
    assert " ".join(first.split()) in " ".join(proc.stdout.split())
    assert first.rstrip().endswith(".")

@pytest.mark.slow  # minutes: each policy trains to the bar
def test_resnet_example_reaches_the_bar() -> None:
    acc = {p: run_example("resnet.py", "--policy", p, "--verbose", "0",
                          timeout=900)[0]["test_accuracy"]
           for p in ("float32", "mixed_bfloat16")}
    print("resnet test accuracy:", acc)
    assert all(a >= 0.97 for a in acc.values()), acc
    assert abs(acc["mixed_bfloat16"] - acc["float32"]) <= 0.02, acc


@pytest.mark.slow  # minutes: each policy trains to the bar
def test_transformer_example_reaches_the_bar() -> None:
    loss = {p: run_example("transformer_lm.py", "--policy", p, "--verbose", "0",
                           "--generate", "0", timeout=900)[0]["val_loss"]
            for p in ("float32", "mixed_bfloat16")}
    print("transformer validation loss:", loss)
    assert all(v <= 1.90 for v in loss.values()), loss
    assert abs(loss["mixed_bfloat16"] - loss["float32"]) <= 0.02 * loss["float32"], loss
