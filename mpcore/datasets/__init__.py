"""Datasets: ``mp.datasets.mnist.load_data()``, as Keras, and
``mp.datasets.stdlib_text.load_data()`` (characters of Python's standard library source)."""

from mpcore.datasets import mnist, stdlib_text

__all__ = ["mnist", "stdlib_text"]
