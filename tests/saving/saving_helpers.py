"""Helpers of the saving tests: the Keras 3-written files of ``data/`` and a Keras 3 to load
mpcore's files with.

Keras 3 cannot be imported without one of its backends' libraries (its NumPy backend imports
jax for convolutions; jax, TensorFlow and PyTorch are each hundreds of MB), so the test
environment does not install it. The Keras-written files were made once by
``make_keras_files.py`` and are committed with Keras' predictions; the checks that Keras 3
reads mpcore's files run Keras in a subprocess, with ``MPCORE_KERAS_PYTHON`` (an interpreter
that has Keras 3 and jax) or the test interpreter where it has them, and skip otherwise
(``.ci/run`` makes such an interpreter in a virtual environment of its own and sets it: there
an unusable one fails the checks).
"""

from __future__ import annotations

import functools
import io
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

DATA = Path(__file__).resolve().parent / "data"
KERAS_FILES = ("dense_block", "conv_stack", "global_pools", "attention", "shapes_and_merges",
               "operators", "nested", "adam_state", "sgd_state", "rmsprop_state", "mixed_state")


def example(name: str) -> tuple[Path, Any, np.ndarray]:
    """A Keras-written file, its input batch (a list for several inputs) and Keras'
    prediction for it."""
    with open(DATA / f"{name}.json") as f:
        record = json.load(f)
    x = ([np.asarray(v, dtype=record["x_dtype"]) for v in record["x"]]
         if record.get("several") else np.asarray(record["x"], dtype=record["x_dtype"]))
    return DATA / f"{name}.keras", x, np.asarray(record["y"], dtype="float64")


def as_array(y: Any) -> np.ndarray:
    """A prediction as one float64 array, several outputs as ``make_keras_files`` joins them
    (stacked when alike, else concatenated along the last axis)."""
    if isinstance(y, list):
        y = (np.stack(y) if y[0].shape == y[-1].shape
             else np.concatenate([np.asarray(v) for v in y], axis=-1))
    return np.asarray(y, "float64")


def weights_tree(path: Path) -> dict[str, tuple[tuple[int, ...], str]]:
    """Every dataset of a .keras file's weights: path -> (shape, dtype kind)."""
    with zipfile.ZipFile(path) as zf:
        data = zf.read("model.weights.h5")
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    with h5py.File(io.BytesIO(data), "r") as h5:
        h5.visititems(lambda name, obj: out.__setitem__(name, (obj.shape, obj.dtype.kind))
                      if isinstance(obj, h5py.Dataset) else None)
    return out


def stored(path: Path, group: str) -> list[np.ndarray]:
    """The datasets of one ``vars`` group of a .keras file, in index order."""
    with zipfile.ZipFile(path) as zf:
        data = zf.read("model.weights.h5")
    with h5py.File(io.BytesIO(data), "r") as h5:
        g = h5[f"{group}/vars" if group else "vars"]
        return [np.asarray(g[str(i)][()]) for i in range(len(g))]


def config_of(path: Path) -> dict[str, Any]:
    with zipfile.ZipFile(path) as zf:
        return json.loads(zf.read("config.json"))


@functools.cache
def keras_python() -> str | None:
    """An interpreter that imports Keras 3 with its NumPy backend, or None."""
    candidates = [os.environ.get("MPCORE_KERAS_PYTHON"), sys.executable]
    for python in filter(None, candidates):
        probe = subprocess.run([python, "-c", "import keras; print(keras.__version__)"],
                               env={**os.environ, "KERAS_BACKEND": "numpy"},
                               capture_output=True, text=True, timeout=300)
        if probe.returncode == 0 and probe.stdout.strip().startswith("3."):
            return python
    return None


def run_keras(script: str, *args: str) -> dict[str, Any]:
    """Run ``script`` under Keras 3 (NumPy backend); it prints one JSON object last."""
    python = keras_python()
    if python is None and os.environ.get("MPCORE_KERAS_PYTHON"):
        pytest.fail(f"MPCORE_KERAS_PYTHON={os.environ['MPCORE_KERAS_PYTHON']} does not import "
                    "Keras 3 with its NumPy backend (it needs keras and jax)")
    if python is None:
        pytest.skip("Keras 3 with a backend is not importable here (its NumPy backend needs "
                    "jax); set MPCORE_KERAS_PYTHON to an interpreter that has keras and jax")
    result = subprocess.run([python, "-c", script, *args],
                            env={**os.environ, "KERAS_BACKEND": "numpy"},
                            capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


#: Loads .keras files in Keras 3 and prints its predictions and optimizer state.
KERAS_LOAD = """
import json, sys, warnings
import numpy as np
import keras
warnings.simplefilter("error", UserWarning)   # Keras warns where it skips a saved state
out = {}
for path, x_path in zip(sys.argv[1::2], sys.argv[2::2]):
    model = keras.models.load_model(path)
    with np.load(x_path, allow_pickle=False) as data:
        x = [data[k] for k in sorted(data.files, key=int)]
    x = x[0] if len(x) == 1 else x
    opt = getattr(model, "optimizer", None)
    y = model.predict(x, verbose=0)
    y = [np.asarray(v, "float64").tolist() for v in y] if isinstance(y, list) else (
        np.asarray(y, "float64").tolist())
    out[path] = {"y": y,
                 "optimizer": None if opt is None else type(opt).__name__,
                 "iterations": None if opt is None else int(opt.iterations),
                 "variables": None if opt is None else [
                     np.asarray(v.numpy(), "float64").tolist() for v in opt.variables]}
print(json.dumps(out))
"""
