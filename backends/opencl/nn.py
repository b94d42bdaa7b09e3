"""Neural-network kernels (``kernels/nn.cl`` and the elementwise program): softmax and
log_softmax, sparse softmax cross-entropy and its gradient, bias_add, relu_grad, dropout_mask.
Softmax and the losses accumulate in float32 for 16-bit inputs."""

from __future__ import annotations

import math

import numpy as np

from .arrays import CLArray
from .programs import KernelFamily


class NNKernels(KernelFamily):
    """Mixin of :class:`~mpcore_opencl.backend.OpenCLBackend`: the neural-network kernels."""

    def _softmax(self, kernel: str, x: CLArray, axis: int) -> CLArray:
        dt = self._dt(x)
        shape = tuple(x.shape)
        if not shape:
            x = self.reshape(x, (1,))
            shape, axis = (1,), 0
        axis %= len(shape)
        outer, k, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
        out = self._empty(tuple(x.shape), dt)
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", "int32"))
        self.runtime.launch(prog[kernel], outer * inner, np.int32(outer), np.int32(k),
                            np.int32(inner), x.data, out.data)
        return out

    def softmax(self, x: CLArray, axis: int) -> CLArray:
        return self._softmax("softmax", x, axis)

    def log_softmax(self, x: CLArray, axis: int) -> CLArray:
        return self._softmax("log_softmax", x, axis)

    def sparse_softmax_cross_entropy(self, logits: CLArray,
                                     labels: CLArray) -> tuple[CLArray, CLArray]:
        # No host read here (it would stall every training step): an out-of-range label goes
        # to the device error record and raises ValueError at the next host read, at the latest
        # the loss-scale flag read that ends a loss-scaled step (whose NaN gradients make the
        # step skip), else the next numpy()/print/metric read or synchronize().
        labels = self._index_array(labels)
        dt = self._dt(logits)
        n, classes = (int(d) for d in logits.shape)
        loss = self._empty((n,), dt)
        probs = self._empty((n, classes), dt)
        rt = self.runtime
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", self._dt(labels)))
        rt.launch(prog["sparse_xent"], n, np.int32(n), np.int32(classes), logits.data,
                  labels.data, loss.data, probs.data, rt.error_record())
        return loss, probs

    def sparse_softmax_cross_entropy_grad(self, probs: CLArray, labels: CLArray,
                                          g: CLArray) -> CLArray:
        labels = self._index_array(labels)
        dt = self._dt(probs)
        if self._dt(g) != dt:
            g = self.cast(g, dt)
        out = self._empty(tuple(probs.shape), dt)
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", self._dt(labels)))
        rt = self.runtime
        rt.launch(prog["sparse_xent_grad"], out.size, np.int32(out.size),
                  np.int32(probs.shape[1]), probs.data, labels.data, g.data, out.data,
                  rt.error_record())
        return out

    def bias_add(self, x: CLArray, bias: CLArray) -> CLArray:
        dt = self._dt(x)
        o = self._empty(x.shape, dt)
        c = int(bias.shape[0]) if bias.shape else 1
        self.runtime.launch(self._elementwise(dt, dt)["bias_add"], o.size, np.int32(o.size),
                            np.int32(c), x.data, bias.data, o.data)
        return o

    def relu_grad(self, g: CLArray, y: CLArray) -> CLArray:
        dt = self._dt(g)
        if self._dt(y) != dt:
            y = self.cast(y, dt)
        if tuple(y.shape) != tuple(g.shape):
            return self.multiply(g, self.cast(self.greater(y, 0), dt))
        o = self._empty(g.shape, dt)
        prog = self._prog("nn.cl", ("A", dt), ("O", dt), ("L", "int32"))
        self.runtime.launch(prog["relu_grad"], o.size, np.int32(o.size), g.data, y.data, o.data)
        return o

    def dropout_mask(self, shape: tuple[int, ...], rate: float, dtype: str,
                     seed: int) -> CLArray:
        return self._random("dropout_mask", shape, dtype, seed, rate, 1.0 / (1.0 - rate))
