"""Layers, the Keras way: ``mp.layers.Dense(64, activation="relu")(inputs)``.

One module per family, as Keras 3's ``layers/`` folders: ``core`` (Dense, Activation,
Dropout, Flatten), ``convolutional``, ``pooling``, ``normalization``, ``embedding``,
``merging``, ``reshaping``, ``attention``, ``activation_layers``; ``base`` holds Layer and
the dtype rules every layer follows, ``symbolic`` the functional graph's KerasTensor and
``operators`` what ``x + y`` on KerasTensors makes.
"""

# operators installs ``x + y`` on KerasTensors when imported
from mpcore.layers import activations, initializers, operators
from mpcore.layers.activation_layers import Softmax
from mpcore.layers.attention import MultiHeadAttention
from mpcore.layers.base import Input, InputLayer, KerasTensor, Layer
from mpcore.layers.convolutional import Conv2D
from mpcore.layers.core import Activation, Dense, Dropout, Flatten
from mpcore.layers.embedding import Embedding
from mpcore.layers.merging import (
    Add,
    Average,
    Concatenate,
    Maximum,
    Minimum,
    Multiply,
    Subtract,
    add,
    average,
    concatenate,
    maximum,
    minimum,
    multiply,
    subtract,
)
from mpcore.layers.normalization import BatchNormalization, LayerNormalization
from mpcore.layers.pooling import (
    AveragePooling2D,
    GlobalAveragePooling1D,
    GlobalAveragePooling2D,
    GlobalMaxPooling1D,
    GlobalMaxPooling2D,
    MaxPooling2D,
)
from mpcore.layers.reshaping import Permute, Reshape

MaxPool2D = MaxPooling2D
AvgPool2D = AveragePooling2D
GlobalAvgPool1D = GlobalAveragePooling1D
GlobalAvgPool2D = GlobalAveragePooling2D
GlobalMaxPool1D = GlobalMaxPooling1D
GlobalMaxPool2D = GlobalMaxPooling2D
Convolution2D = Conv2D

__all__ = [
    "Activation", "Add", "Average", "AveragePooling2D", "AvgPool2D", "BatchNormalization",
    "Concatenate", "Conv2D", "Convolution2D", "Dense", "Dropout", "Embedding", "Flatten",
    "GlobalAveragePooling1D", "GlobalAveragePooling2D", "GlobalAvgPool1D", "GlobalAvgPool2D",
    "GlobalMaxPool1D", "GlobalMaxPool2D", "GlobalMaxPooling1D", "GlobalMaxPooling2D", "Input",
    "InputLayer", "KerasTensor", "Layer", "LayerNormalization", "MaxPool2D", "MaxPooling2D",
    "Maximum", "Minimum", "MultiHeadAttention", "Multiply", "Permute", "Reshape", "Softmax",
    "Subtract", "activations", "add", "average", "concatenate", "initializers", "maximum",
    "minimum", "multiply", "operators", "subtract",
]
