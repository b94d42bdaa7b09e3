"""Datasets: ``mp.datasets.mnist.load_data()``, as Keras."""

from mpcore.datasets import mnist

__all__ = ["mnist"]
