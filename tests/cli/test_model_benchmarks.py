"""benchmarks/model_step.py and compare.py --model resnet|transformer on tiny sizes: valid
JSON, the thread count recorded, both sides alternating (no timing assertions)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO_ROOT

import mpcore as mp

BENCH = REPO_ROOT / "benchmarks"
TORCH_PYTHON = Path("/work/torchvenv/bin/python")
NEEDED = {"resnet": ("BatchNormalization", "GlobalAveragePooling2D", "add"),
          "transformer": ("Embedding", "MultiHeadAttention", "add")}
TINY = {"resnet": ["--size", "8", "--blocks", "1"],
        "transformer": ["--seq-len", "8", "--d-model", "16", "--heads", "2", "--layers", "1"]}


def run(*args: str, python: str = sys.executable, timeout: int = 300) -> list[dict[str, Any]]:
    proc = subprocess.run([python, *args], capture_output=True, text=True, timeout=timeout,
                          cwd=REPO_ROOT, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(ln) for ln in proc.stdout.splitlines() if ln.startswith("{")]


def needs_layers(model: str) -> None:
    missing = [n for n in NEEDED[model] if not hasattr(mp.layers, n)]
    if missing:
        pytest.skip(f"mp.layers lacks {', '.join(missing)}")


@pytest.mark.parametrize("model", ["resnet", "transformer"])
def test_model_step_quick(model: str) -> None:
    records = run(str(BENCH / "model_step.py"), "--model", model, "--quick", "--threads", "1",
                  "--policy", "float32", "mixed_bfloat16")
    assert [r["policy"] for r in records] == ["float32", "mixed_bfloat16"]
    for r in records:
        assert r["bench"] == "model_step" and r["model"] == model and r["threads"] == 1
        if "skipped" in r:
            assert "mp.layers lacks" in r["skipped"]
            continue
        assert r["samples_per_s"] > 0 and r["params"] > 0


@pytest.mark.parametrize("model", ["resnet", "transformer"])
def test_torch_twins_quick(model: str) -> None:
    if not TORCH_PYTHON.exists():
        pytest.skip(f"no torch interpreter at {TORCH_PYTHON}")
    records = run(str(BENCH / "peers" / f"torch_{model}.py"), "--policy", "mixed_bfloat16",
                  "--batch", "2", "--steps", "1", "--warmup", "1", "--threads", "1",
                  *TINY[model], python=str(TORCH_PYTHON))
    assert records[-1]["model"] == model and records[-1]["threads"] == 1


@pytest.mark.parametrize("model", ["resnet", "transformer"])
def test_compare_models(model: str) -> None:
    needs_layers(model)
    args = [str(BENCH / "compare.py"), "--model", model, "--policy", "float32",
            "mixed_bfloat16", "--batch", "2", "--steps", "1", "--warmup", "1", "--rounds", "2",
            *TINY[model]]
    if TORCH_PYTHON.exists():
        args += ["--torch-python", str(TORCH_PYTHON)]
    result = run(*args, timeout=600)[-1]
    assert result["bench"] == "compare" and result["model"] == model
    assert result["threads"] == 1 and result["paths"] == ["fit"]
    assert len(result["runs"]["float32"]["fit"]) == 2
    assert all(r["threads"] == 1 for r in result["runs"]["float32"]["fit"])
    assert all(t["status"].startswith("not applicable: the targets are set for the guide's MLP")
               for t in result["targets"] if t["status"] != "not run")
    if TORCH_PYTHON.exists():
        entry = result["summary"]["mixed_bfloat16"]["fit"]
        assert len(entry["vs_torch_rounds"]) == 2
        assert [r["threads"] for r in result["runs"]["float32"]["torch"]] == [1, 1]


def test_compare_rejects_the_loop_path_for_models() -> None:
    proc = subprocess.run([sys.executable, str(BENCH / "compare.py"), "--model", "resnet",
                           "--path", "loop"], capture_output=True, text=True, timeout=60,
                          check=False)
    assert proc.returncode == 2 and "times Model.fit only" in proc.stderr
