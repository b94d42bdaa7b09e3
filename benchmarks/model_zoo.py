"""The benchmark models in mpcore, built with the Keras API (``mp.layers``, ``mp.Model``): the
same networks as the PyTorch twins in ``benchmarks/peers/`` (shapes, paddings, epsilons and
optimizers; see their docstrings).

- :func:`resnet`: ResNet-20-style for (size, size, 1) images: conv3x3-BN-relu stem, 3 stages of
  ``blocks`` residual blocks (conv3x3-BN-relu-conv3x3-BN + shortcut, relu; stages 2 and 3
  stride by 2 and project the shortcut with a 1x1 conv + BN), global average pooling, Dense.
- :func:`transformer`: a decoder-only character LM: token + position embeddings, ``layers``
  pre-LN blocks (causal MultiHeadAttention, GELU MLP of 4 * d_model), LayerNorm, Dense(vocab).

Both end in float32 logits (``Activation("linear", dtype="float32")``: the guide's rule that
the outputs, and so the loss, stay float32 under a mixed policy).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mpcore as mp
from mpcore import layers

#: The layers these models need that the tree may not have yet (issue 32 brings them)
NEEDED = {"resnet": ("BatchNormalization", "GlobalAveragePooling2D", "Add", "add"),
          "transformer": ("Embedding", "MultiHeadAttention", "Add", "add")}


def missing_layers(model: str) -> list[str]:
    """The layers of :data:`NEEDED` that ``mp.layers`` lacks for ``model``."""
    return [name for name in NEEDED[model] if not hasattr(layers, name)]


@dataclass(frozen=True)
class ResNetShape:
    size: int = 32
    width: int = 1
    blocks: int = 3
    classes: int = 10


@dataclass(frozen=True)
class TransformerShape:
    vocab: int = 98
    seq_len: int = 64
    d_model: int = 128
    heads: int = 4
    layers: int = 2


def _conv_bn(x: Any, filters: int, kernel: int, strides: int, name: str) -> Any:
    # no bias: the BatchNormalization after it has its own offset
    x = layers.Conv2D(filters, kernel, strides=strides, padding="same", use_bias=False,
                 name=f"{name}_conv")(x)
    return layers.BatchNormalization(epsilon=1e-3, momentum=0.99, name=f"{name}_bn")(x)


def residual_block(x: Any, filters: int, strides: int, name: str) -> Any:
    h = _conv_bn(x, filters, 3, strides, f"{name}_a")
    h = layers.Activation("relu", name=f"{name}_relu1")(h)
    h = _conv_bn(h, filters, 3, 1, f"{name}_b")
    shortcut = x
    if strides != 1 or x.shape[-1] != filters:
        shortcut = _conv_bn(x, filters, 1, strides, f"{name}_proj")
    return layers.Activation("relu", name=f"{name}_out")(layers.add([h, shortcut]))


def resnet(shape: ResNetShape = ResNetShape()) -> Any:
    """An un-compiled ``mp.Model``: (N, size, size, 1) float images -> (N, classes) logits."""
    widths = [16 * shape.width, 32 * shape.width, 64 * shape.width]
    inputs = mp.Input(shape=(shape.size, shape.size, 1), name="images")
    x = layers.Activation("relu", name="stem_relu")(_conv_bn(inputs, widths[0], 3, 1, "stem"))
    for stage, filters in enumerate(widths):
        for b in range(shape.blocks):
            x = residual_block(x, filters, 2 if stage > 0 and b == 0 else 1, f"s{stage}b{b}")
    x = layers.GlobalAveragePooling2D(name="pool")(x)
    x = layers.Dense(shape.classes, name="logits")(x)
    outputs = layers.Activation("linear", dtype="float32", name="logits_f32")(x)
    return mp.Model(inputs=inputs, outputs=outputs, name="resnet")


class PositionEmbedding(layers.Layer):
    """Adds a learned (seq_len, d) position table to (N, seq_len, d) token embeddings: the
    second half of Keras' TokenAndPositionEmbedding, without the ``ops.arange`` input."""

    def __init__(self, seq_len: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.seq_len = seq_len

    def build(self, input_shape: Any) -> None:
        if input_shape[-2] != self.seq_len:
            raise ValueError(f"PositionEmbedding {self.name!r}: expects {self.seq_len} "
                             f"positions, got shape {input_shape}")
        # Keras Embedding's initializer
        self.table = self.add_weight("embeddings", (self.seq_len, input_shape[-1]),
                                     layers.initializers.RandomUniform(-0.05, 0.05))

    def call(self, inputs: Any) -> Any:
        return inputs + self.table.read_as(self.compute_dtype)

    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "seq_len": self.seq_len}


def transformer_block(x: Any, d_model: int, heads: int, name: str) -> Any:
    h = layers.LayerNormalization(epsilon=1e-3, name=f"{name}_ln1")(x)
    h = layers.MultiHeadAttention(num_heads=heads, key_dim=d_model // heads,
                             name=f"{name}_attn")(h, h, use_causal_mask=True)
    x = layers.add([x, h])
    h = layers.LayerNormalization(epsilon=1e-3, name=f"{name}_ln2")(x)
    h = layers.Dense(4 * d_model, activation="gelu", name=f"{name}_up")(h)
    h = layers.Dense(d_model, name=f"{name}_down")(h)
    return layers.add([x, h])


def transformer(shape: TransformerShape = TransformerShape()) -> Any:
    """An un-compiled ``mp.Model``: (N, seq_len) int32 ids -> (N, seq_len, vocab) logits."""
    if shape.d_model % shape.heads:
        raise ValueError(f"d_model ({shape.d_model}) must be a multiple of heads "
                         f"({shape.heads})")
    inputs = mp.Input(shape=(shape.seq_len,), dtype="int32", name="ids")
    x = layers.Embedding(shape.vocab, shape.d_model, name="tokens")(inputs)
    x = PositionEmbedding(shape.seq_len, name="positions")(x)
    for i in range(shape.layers):
        x = transformer_block(x, shape.d_model, shape.heads, f"block{i}")
    x = layers.LayerNormalization(epsilon=1e-3, name="final_ln")(x)
    x = layers.Dense(shape.vocab, name="logits")(x)
    outputs = layers.Activation("linear", dtype="float32", name="logits_f32")(x)
    return mp.Model(inputs=inputs, outputs=outputs, name="char_lm")


def optimizer(name: str) -> Any:
    """The twins' optimizers with Keras' spelling: SGD 0.1 with momentum 0.9, or Adam 1e-3
    (epsilon 1e-7, Keras' default, which the PyTorch twins set too)."""
    if name == "sgd":
        return mp.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    if name == "adam":
        return mp.optimizers.Adam(learning_rate=1e-3)
    raise ValueError(f"optimizer must be 'sgd' or 'adam', got {name!r}")
