"""Layers, the Keras way: ``mp.layers.Dense(64, activation="relu")(inputs)``.

See :mod:`mpcore.layers.base` for the dtype rules every layer follows.
"""

from mpcore.layers import activations, initializers
from mpcore.layers.base import Input, InputLayer, KerasTensor, Layer
from mpcore.layers.convolutional import Conv2D, MaxPooling2D
from mpcore.layers.core import Activation, Dense, Dropout, Flatten, LayerNormalization
from mpcore.layers.embedding import Embedding
from mpcore.layers.normalization import BatchNormalization

MaxPool2D = MaxPooling2D
Convolution2D = Conv2D

__all__ = ["Activation", "Conv2D", "Convolution2D", "Dense", "Dropout", "Flatten", "Input",
           "InputLayer", "KerasTensor", "Layer", "LayerNormalization", "MaxPool2D",
           "MaxPooling2D", "activations", "initializers"]
__all__ += ["BatchNormalization", "Embedding"]
