"""The data, the float32 model (the guide's, in a small size) and the fixture of the automatic
mixed precision tests (no conftest.py here: tests/conftest.py is imported as `conftest`)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

import mpcore as mp

#: The offline MNIST files: ../shared beside the checkout, else where MPCORE_DATA_DIR says
#: (a git worktree's parent is not the project's).
MNIST = next((p for p in (Path(__file__).resolve().parents[2].parent / "shared" / "data" /
                          "mnist", Path(os.environ.get("MPCORE_DATA_DIR", "")))
              if p.name and (p / "t10k-images-idx3-ubyte.gz").is_file()), None)
needs_mnist = pytest.mark.skipif(MNIST is None, reason="the shared MNIST files are not here "
                                 "(../shared/data/mnist, or MPCORE_DATA_DIR)")

RNG = np.random.default_rng(7)
X = RNG.standard_normal((128, 20)).astype(np.float32)
Y = ((X[:, :5].sum(axis=1) > 0).astype(np.int64) + 2 * (X[:, 5] > 0.3)).astype(np.int64)


def float32_model(units: int = 32, inputs: int = 20, classes: int = 4, seed: int = 0
                  ) -> mp.Model:
    """The guide's model (two relu Dense layers, logits, a float32 softmax), in float32."""
    mp.random.set_seed(seed)
    x_in = mp.Input(shape=(inputs,), name="digits")
    x = mp.layers.Dense(units, activation="relu", name="dense_1")(x_in)
    x = mp.layers.Dense(units, activation="relu", name="dense_2")(x)
    x = mp.layers.Dense(classes, name="dense_logits")(x)
    out = mp.layers.Activation("softmax", dtype="float32", name="predictions")(x)
    return mp.Model(inputs=x_in, outputs=out)


@pytest.fixture(autouse=True)
def rewrite_off() -> Iterator[None]:
    """Imported by each test module: the graph rewrite is disabled after each test."""
    yield
    mp.mixed_precision.disable_mixed_precision_graph_rewrite()
