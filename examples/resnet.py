"""A ResNet-20-style network on MNIST with mixed precision, written with the Keras 3 API.

    MPCORE_DATA_DIR=../shared/data/mnist python examples/resnet.py --policy mixed_bfloat16

Offline (``MPCORE_DATA_DIR`` pointing at the MNIST test files) it trains on the 8,000/2,000
split of the MNIST test set, else on the full set (downloaded once into ~/.cache/mpcore).
The network is He et al.'s CIFAR ResNet: a 3x3 conv stem, three stages of residual blocks
(conv3x3-BN-relu-conv3x3-BN plus the shortcut, relu; the first block of stages 2 and 3 halves
the image and projects its shortcut with a 1x1 conv + BN), global average pooling and a Dense
classifier, with 16/32/64 channels times ``--width``. ``--blocks 3`` (the default) is
ResNet-20; ``--blocks 1`` (ResNet-8) trains in about a third of the time.

Mixed precision, as the guide says: convolutions and the Dense layers compute in the policy's
16-bit type with float32 variables; BatchNormalization computes its statistics in float32; the
logits are cast to float32 (an ``Activation("linear", dtype="float32")``) so the softmax
cross-entropy runs in float32. ``mixed_float16`` wraps the optimizer in a LossScaleOptimizer.

Target: >= 0.97 test accuracy (the offline split) in a few minutes on 2 CPU cores, and
mixed_bfloat16 within 2 points of float32. The last line is JSON: policy, accuracy, seconds.
"""

from __future__ import annotations

import argparse
import json
import math
import time
from typing import Any

import numpy as np

import mpcore as mp
from mpcore import layers

POLICIES = ("float32", "mixed_bfloat16", "mixed_float16")
TARGET_ACCURACY = 0.97


def conv_bn(x: Any, filters: int, kernel: int, strides: int = 1) -> Any:
    # no bias: the BatchNormalization right after has its own offset (beta)
    x = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False)(x)
    # momentum 0.9, not Keras' 0.99: the moving statistics (what inference uses) then average
    # the last ~10 batches instead of ~100. A run of a few hundred steps changes the weights
    # faster than a 100-step average follows, and with 0.99 the test accuracy (inference
    # mode) fell to 0.66 while the training accuracy (batch statistics) was 0.98.
    return layers.BatchNormalization(momentum=0.9)(x)


def residual_block(x: Any, filters: int, strides: int) -> Any:
    h = layers.Activation("relu")(conv_bn(x, filters, 3, strides))
    h = conv_bn(h, filters, 3)
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        # the shapes differ: a 1x1 projection, as in ResNet's option B
        shortcut = conv_bn(x, filters, 1, strides)
    return layers.Activation("relu")(layers.add([h, shortcut]))


def build_resnet(input_shape: tuple[int, int, int], width: int = 1, blocks: int = 3,
                 classes: int = 10) -> Any:
    inputs = mp.Input(shape=input_shape, name="images")
    x = layers.Activation("relu")(conv_bn(inputs, 16 * width, 3))
    for stage, filters in enumerate((16 * width, 32 * width, 64 * width)):
        for block in range(blocks):
            x = residual_block(x, filters, 2 if stage > 0 and block == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dense(classes, name="logits")(x)
    # the loss in float32, whatever the policy
    outputs = layers.Activation("linear", dtype="float32", name="logits_f32")(x)
    return mp.Model(inputs=inputs, outputs=outputs, name="resnet")


def load_mnist(pad: bool, train_limit: int | None,
               test_limit: int | None) -> tuple[Any, Any, Any, Any]:
    (x_train, y_train), (x_test, y_test) = mp.datasets.mnist.load_data()

    def images(x: Any) -> Any:
        x = x.astype("float32")[..., None] / 255.0          # NHWC, one channel
        if pad:  # 32x32, CIFAR's size, as the original ResNet
            x = np.pad(x, ((0, 0), (2, 2), (2, 2), (0, 0)))
        return x

    return (images(x_train[:train_limit]), y_train[:train_limit].astype("int32"),
            images(x_test[:test_limit]), y_test[:test_limit].astype("int32"))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    ap.add_argument("--policy", choices=POLICIES, default="mixed_bfloat16")
    ap.add_argument("--epochs", type=int, default=3)
    ap.add_argument("--jit", action=argparse.BooleanOptionalAction, default=True,
                    help="traced train steps (compile(jit_compile=True)); --no-jit: eager")
    ap.add_argument("--width", type=int, default=1, help="channels: width x 16/32/64")
    ap.add_argument("--blocks", type=int, default=3,
                    help="residual blocks per stage (3: ResNet-20; 1: ResNet-8)")
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--learning-rate", type=float, default=2e-3,
                    help="Adam's first rate, decayed to 0 over the training (a cosine)")
    ap.add_argument("--pad", action="store_true", help="pad the 28x28 images to 32x32")
    ap.add_argument("--train-limit", type=int, default=None, help="use this many training images")
    ap.add_argument("--test-limit", type=int, default=None, help="use this many test images")
    ap.add_argument("--verbose", type=int, choices=(0, 1, 2), default=1, help="fit's")
    ap.add_argument("--seed", type=int, default=0,
                    help="mp.random.set_seed: the initial weights and fit's shuffling")
    a = ap.parse_args(argv)
    for name in ("epochs", "width", "blocks", "batch_size"):
        if getattr(a, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(a, name)}")

    print(mp.check_policy(a.policy))
    mp.random.set_seed(a.seed)
    mp.set_global_policy(a.policy)
    x_train, y_train, x_test, y_test = load_mnist(a.pad, a.train_limit, a.test_limit)
    model = build_resnet(x_train.shape[1:], a.width, a.blocks)
    # Keras 3's CosineDecay, from the rate down to 0: large steps early, small ones at the end,
    # where the weights (and with them BatchNormalization's moving statistics) settle
    steps = a.epochs * math.ceil(len(x_train) / a.batch_size)
    model.compile(optimizer=mp.optimizers.Adam(
        mp.optimizers.schedules.CosineDecay(a.learning_rate, decay_steps=steps)),
                  loss=mp.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"], jit_compile=a.jit)
    print(f"{model.name}: {a.blocks} block(s) per stage, width {a.width}, "
          f"{sum(int(np.prod(v.shape)) for v in model.trainable_variables):,} parameters, "
          f"images {x_train.shape[1:]}, {len(x_train)} training / {len(x_test)} test")
    t0 = time.perf_counter()
    model.fit(x_train, y_train, batch_size=a.batch_size, epochs=a.epochs, verbose=a.verbose)
    train_s = time.perf_counter() - t0
    loss, accuracy = model.evaluate(x_test, y_test, batch_size=256, verbose=0)
    print(f"Test loss: {loss:.4f}  Test accuracy: {accuracy:.4f} "
          f"({'meets' if accuracy >= TARGET_ACCURACY else 'below'} the {TARGET_ACCURACY} bar)"
          f"  training: {train_s:.1f} s")
    print(json.dumps({"example": "resnet", "policy": a.policy, "jit": a.jit,
                      "backend": mp.get_backend().name, "epochs": a.epochs,
                      "blocks": a.blocks, "width": a.width, "test_loss": round(loss, 4),
                      "test_accuracy": round(accuracy, 4), "train_seconds": round(train_s, 1)}))
    mp.set_global_policy(None)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
