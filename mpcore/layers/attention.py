"""MultiHeadAttention, Keras 3's (names, signature, defaults, weights, config keys).

Precision rule (issue 32): the query/key/value and output projections and the
``probabilities @ value`` product are GEMMs in the compute dtype (16 bits under a mixed
policy, float32 accumulation); the scores ``Q K^T / sqrt(key_dim)``, the mask and the softmax
are float32, since 16-bit logits lose the small differences softmax turns into large ones.
The scores returned by ``return_attention_scores=True`` are those float32 probabilities
(Keras 3 rounds them to the compute dtype first); the output is in the compute dtype.

Attention runs over any set of the inputs' inner axes (``attention_axes``, Keras' default:
every axis but the batch and the features): the other inner axes join the batch, the
attention axes are flattened into one sequence axis, and one 3-D attention runs on that.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Sequence
from typing import Any

from mpcore import ops
from mpcore.core import arguments as _args
from mpcore.core.tensor import Tensor
from mpcore.layers import initializers
from mpcore.layers.activation_layers import large_negative
from mpcore.layers.base import Layer

# Keras 3 arguments mpcore has no machinery for: accepted (and kept in the config) only as None
_UNSUPPORTED = ("kernel_regularizer", "bias_regularizer", "activity_regularizer",
                "kernel_constraint", "bias_constraint")


def _positive_int(value: Any) -> bool:
    return _args.is_integer(value) and value > 0


class _EinsumProjection(Layer):
    """The projections of MultiHeadAttention, with the kernels of Keras' EinsumDense: the
    input's last ``len(in_dims)`` axes are contracted with a kernel of shape
    ``(*in_dims, *out_dims)`` and a bias of shape ``out_dims`` is added. Computed as one GEMM
    (``ops.dense``) on 2-D views of the input and the kernel, so it is an *allow* op."""

    def __init__(self, in_dims: Sequence[int], out_dims: Sequence[int], use_bias: bool,
                 kernel_initializer: Any, bias_initializer: Any, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.in_dims, self.out_dims = tuple(in_dims), tuple(out_dims)
        self.use_bias = use_bias
        self.kernel_initializer, self.bias_initializer = kernel_initializer, bias_initializer

    def build(self, input_shape: Any) -> None:
        self.kernel = self.add_weight("kernel", (*self.in_dims, *self.out_dims),
                                      self.kernel_initializer)
        self.bias = (self.add_weight("bias", self.out_dims, self.bias_initializer)
                     if self.use_bias else None)

    def call(self, inputs: Tensor, training: bool | None = None) -> Tensor:
        dt = self.compute_dtype
        n_in, n_out = math.prod(self.in_dims), math.prod(self.out_dims)
        lead = inputs.shape[:inputs.ndim - len(self.in_dims)]
        x = ops.reshape(inputs, (*lead, n_in))
        kernel = ops.reshape(self.kernel.read_as(dt), (n_in, n_out))
        bias = None if self.bias is None else ops.reshape(self.bias.read_as(dt), (n_out,))
        return ops.reshape(ops.dense(x, kernel, bias), (*lead, *self.out_dims))


class MultiHeadAttention(Layer):
    """Multi-head attention (Vaswani et al., 2017) as Keras 3's ``MultiHeadAttention``.

    ``mha(query, value, key=None, ...)`` with query ``(B, T, dim)`` and value/key
    ``(B, S, dim)`` returns ``(B, T, dim)`` (or ``(B, T, *output_shape)``), and with
    ``return_attention_scores=True`` also the probabilities ``(B, num_heads, T, S)``.
    Masks (1 or True: attend) are combined by AND: ``attention_mask`` (broadcast to
    ``(B, T, S)`` or ``(B, num_heads, T, S)``), ``query_mask`` ``(B, T)``, ``value_mask`` and
    ``key_mask`` ``(B, S)``, and the lower-triangular ``(T, S)`` mask of
    ``use_causal_mask=True``. Weights, in Keras' order: ``query/kernel`` ``(dim, num_heads,
    key_dim)``, ``query/bias`` ``(num_heads, key_dim)``, the same for ``key`` and ``value``
    (``value_dim``), then ``attention_output/kernel`` ``(num_heads, value_dim, dim)`` and
    ``attention_output/bias`` ``(dim,)``."""

    def __init__(self, num_heads: int, key_dim: int, value_dim: int | None = None,
                 dropout: float = 0.0, use_bias: bool = True,
                 output_shape: int | Sequence[int] | None = None,
                 attention_axes: int | Sequence[int] | None = None,
                 kernel_initializer: Any = "glorot_uniform", bias_initializer: Any = "zeros",
                 seed: int | None = None, **kwargs: Any) -> None:
        for arg in (*_UNSUPPORTED, "flash_attention"):
            if kwargs.pop(arg, None) is not None:
                raise NotImplementedError(f"MultiHeadAttention: {arg} is not supported by "
                                          "mpcore; leave it None")
        super().__init__(**kwargs)
        where = f"MultiHeadAttention {self.name!r}"
        if not _positive_int(num_heads):
            raise ValueError(f"{where}: argument `num_heads` must be a positive int, got "
                             f"{num_heads!r}")
        if not _positive_int(key_dim):
            raise ValueError(f"{where}: argument `key_dim` must be a positive int, got "
                             f"{key_dim!r}")
        if value_dim is not None and not _positive_int(value_dim):
            raise ValueError(f"{where}: argument `value_dim` must be a positive int or None, got "
                             f"{value_dim!r}")
        if isinstance(dropout, bool) or not 0.0 <= float(dropout) < 1.0:
            raise ValueError(f"{where}: dropout must be a float in [0, 1), got {dropout!r}")
        if output_shape is not None:
            shape = (output_shape,) if isinstance(output_shape, numbers.Integral) else (
                tuple(output_shape) if isinstance(output_shape, (list, tuple)) else None)
            if not shape or not all(_positive_int(d) for d in shape):
                raise ValueError(f"{where}: Invalid `output_shape`: {output_shape!r}; expected "
                                 "a positive int or a tuple or list of them (or None)")
            output_shape = tuple(int(d) for d in shape)
        if _args.is_integer(attention_axes):
            attention_axes = (int(attention_axes),)
        elif attention_axes is not None:
            if not isinstance(attention_axes, (list, tuple)) or not all(
                    _args.is_integer(a) for a in attention_axes):
                raise ValueError(f"{where}: attention_axes must be an int, a list or tuple "
                                 f"of ints, or None, got {attention_axes!r}")
            attention_axes = tuple(int(a) for a in attention_axes)
        initializers.get(kernel_initializer)    # an unknown name fails here, not at build
        initializers.get(bias_initializer)
        self._num_heads, self._key_dim = int(num_heads), int(key_dim)
        self._value_dim = int(value_dim) if value_dim else self._key_dim
        self._dropout = float(dropout)
        self._use_bias = bool(use_bias)
        self._output_shape: tuple[int, ...] | None = output_shape
        self._attention_axes: tuple[int, ...] | None = attention_axes
        self._kernel_initializer, self._bias_initializer = kernel_initializer, bias_initializer
        self.seed = seed
        self._inverse_sqrt_key_dim = 1.0 / math.sqrt(float(self._key_dim))

    num_heads = property(lambda self: self._num_heads)
    key_dim = property(lambda self: self._key_dim)
    value_dim = property(lambda self: self._value_dim)
    dropout = property(lambda self: self._dropout)
    use_bias = property(lambda self: self._use_bias)
    attention_axes = property(lambda self: self._attention_axes)

    # --- building -------------------------------------------------------------------------
    def build(self, query_shape: Any, value_shape: Any, key_shape: Any = None) -> None:
        where = f"MultiHeadAttention {self.name!r}"
        if value_shape is None:
            raise ValueError(f"{where} is called as mha(query, value, key=None, ...): a value "
                             "tensor is required")
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        if value_shape[1:-1] != key_shape[1:-1]:
            raise ValueError("All dimensions of `value` and `key`, except the last one, must "
                             f"be equal. Received: value_shape={value_shape} and "
                             f"key_shape={key_shape}")
        rank = len(query_shape)
        for arg, shape in (("query", query_shape), ("value", value_shape), ("key", key_shape)):
            if len(shape) < 3:
                raise ValueError(f"{where}: {arg} must have rank >= 3 (batch, <attention "
                                 f"axes>, features), e.g. (B, T, dim); got shape {shape}")
            if len(shape) != rank:
                raise ValueError(f"{where}: query, value and key must have the same rank; got "
                                 f"query {query_shape} and {arg} {shape}")
            if shape[-1] is None:
                raise ValueError(f"{where}: the last axis (features) of {arg} must be known, "
                                 f"got shape {shape}")
        self._attention_axes = self._normalized_axes(rank)
        common = {"use_bias": self._use_bias, "kernel_initializer": self._kernel_initializer,
                  "bias_initializer": self._bias_initializer, "dtype": self.dtype_policy}
        heads = self._num_heads
        # assigned in Keras' order, so that the weights come in Keras' order
        self._query_dense = _EinsumProjection((query_shape[-1],), (heads, self._key_dim),
                                              name="query", **common)
        self._key_dense = _EinsumProjection((key_shape[-1],), (heads, self._key_dim),
                                            name="key", **common)
        self._value_dense = _EinsumProjection((value_shape[-1],), (heads, self._value_dim),
                                              name="value", **common)
        out = self._output_shape or (query_shape[-1],)
        self._output_dense = _EinsumProjection((heads, self._value_dim), out,
                                               name="attention_output", **common)
        for layer, shape in ((self._query_dense, query_shape), (self._key_dense, key_shape),
                             (self._value_dense, value_shape),
                             (self._output_dense, (*query_shape[:-1], heads, self._value_dim))):
            layer._maybe_build(shape)
        self._dims = (query_shape[-1], value_shape[-1], key_shape[-1])
        self._rank = rank

    def compute_output_shape(self, query_shape: Any, value_shape: Any,
                             key_shape: Any = None) -> tuple[int | None, ...]:
        """The output's shape: the query's with its last axis ``output_shape`` (Keras')."""
        query_shape, value_shape = tuple(query_shape), tuple(value_shape)
        key_shape = value_shape if key_shape is None else tuple(key_shape)
        if value_shape[1:-1] != key_shape[1:-1]:
            raise ValueError("All dimensions of `value` and `key`, except the last one, must "
                             f"be equal. Received: value_shape={value_shape} and "
                             f"key_shape={key_shape}")
        return query_shape[:-1] + (self._output_shape or query_shape[-1:])

    def _normalized_axes(self, rank: int) -> tuple[int, ...]:
        """The attention axes as axes of the inputs (Keras counts a negative axis from the
        end of the projected (..., heads, channels) tensor, which is the same axis)."""
        if self._attention_axes is None:
            return tuple(range(1, rank - 1))
        axes = tuple(a if a >= 0 else rank + a for a in self._attention_axes)
        if not axes or len(set(axes)) != len(axes) or any(not 1 <= a <= rank - 2
                                                            for a in axes):
            raise ValueError(f"MultiHeadAttention {self.name!r}: attention_axes must be "
                             f"distinct axes among the inner axes 1..{rank - 2} (or "
                             f"{-(rank - 1)}..-2) of rank-{rank} inputs, got "
                             f"{self._attention_axes}")
        return tuple(sorted(axes))

    @property
    def query_dense(self) -> Layer:
        return self._query_dense

    @property
    def key_dense(self) -> Layer:
        return self._key_dense

    @property
    def value_dense(self) -> Layer:
        return self._value_dense

    @property
    def output_dense(self) -> Layer:
        return self._output_dense

    # --- calling --------------------------------------------------------------------------
    def call(self, query: Tensor, value: Tensor, key: Tensor | None = None,
             query_mask: Any = None, value_mask: Any = None, key_mask: Any = None,
             attention_mask: Any = None, return_attention_scores: bool = False,
             training: bool | None = None, use_causal_mask: bool = False) -> Any:
        key = value if key is None else key
        self._check_inputs(query, value, key)
        rank, axes = query.ndim, self._attention_axes
        assert axes is not None  # set by build
        batch_axes = tuple(a for a in range(1, rank - 1) if a not in axes)
        order = (0, *batch_axes, *axes)
        lead = tuple(query.shape[a] for a in order[:1 + len(batch_axes)])
        q_att = tuple(query.shape[a] for a in axes)
        k_att = tuple(value.shape[a] for a in axes)
        n, t, s, heads = math.prod(lead), math.prod(q_att), math.prod(k_att), self._num_heads
        keep = self._combined_mask(query, value, query_mask, value_mask, key_mask,
                                   attention_mask, use_causal_mask, (*lead, heads, *q_att,
                                                                     *k_att))

        def flat(x: Tensor, length: int) -> Tensor:
            # (B, <inner axes>, dim) -> (n, length, dim): the axes not attended over join the
            # batch and the attention axes become one, so one 3-D attention serves every case
            if order != tuple(range(rank - 1)):
                x = ops.transpose(x, (*order, rank - 1))
            return ops.reshape(x, (n, length, x.shape[-1]))

        # projected (n, length, H, k) -> (n, H, length, k): the heads batch the GEMMs below
        q = ops.transpose(self._query_dense(flat(query, t)), (0, 2, 1, 3))
        k = ops.transpose(self._key_dense(flat(key, s)), (0, 2, 1, 3))
        v = ops.transpose(self._value_dense(flat(value, s)), (0, 2, 1, 3))
        # the scores, their mask and softmax in float32 (float64 under a float64 policy)
        sdt = "float64" if q.dtype == "float64" else "float32"
        q = ops.multiply(ops.cast(q, sdt), self._inverse_sqrt_key_dim)
        scores = ops.matmul(q, ops.cast(k, sdt), transpose_b=True)          # (n, H, t, s)
        if keep is not None:
            keep = ops.cast(keep, sdt)
            if keep.ndim != 4:   # several batch or attention axes: as (n, H or 1, t, s)
                full = (*lead, keep.shape[len(lead)], *q_att, *k_att)
                keep = ops.reshape(ops.broadcast_to(keep, full), (n, full[len(lead)], t, s))
            # Softmax's rule: a masked logit gets a large negative number
            scores = ops.add(scores, ops.multiply(ops.subtract(1.0, keep), large_negative(sdt)))
        probs = ops.softmax(scores, axis=-1)
        p = ops.cast(probs, self.compute_dtype)
        if training and self._dropout > 0.0:
            p = ops.dropout(p, self._dropout, self.seed)
        context = ops.transpose(ops.matmul(p, v), (0, 2, 1, 3))              # (n, t, H, v)
        out = self._output_dense(context)                                    # (n, t, *out)
        out_dims = out.shape[2:]
        out = ops.reshape(out, (*lead, *q_att, *out_dims))
        if order != tuple(range(rank - 1)):
            back = tuple(order.index(i) for i in range(rank - 1))
            out = ops.transpose(out, (*back, *range(rank - 1, rank - 1 + len(out_dims))))
        if not return_attention_scores:
            return out
        return out, ops.reshape(probs, (*lead, heads, *q_att, *k_att))

    def _check_inputs(self, query: Tensor, value: Tensor, key: Tensor) -> None:
        where = f"MultiHeadAttention {self.name!r}"
        for arg, x, dim in (("query", query, self._dims[0]), ("value", value, self._dims[1]),
                            ("key", key, self._dims[2])):
            if not isinstance(x, Tensor):
                raise ValueError(f"{where}: {arg} must be a tensor or an array, got "
                                 f"{type(x).__name__}")
            if x.ndim != self._rank or x.shape[-1] != dim:
                raise ValueError(f"{where} was built for {arg} of rank {self._rank} with "
                                 f"{dim} features (last axis), got shape {x.shape}")
        if value.shape[1:-1] != key.shape[1:-1]:
            raise ValueError("All dimensions of `value` and `key`, except the last one, must "
                             f"be equal. Received: value_shape={value.shape} and "
                             f"key_shape={key.shape}")
        assert self._attention_axes is not None
        batch = [0, *(a for a in range(1, query.ndim - 1) if a not in self._attention_axes)]
        if any(query.shape[a] != value.shape[a] for a in batch):
            raise ValueError(f"{where}: query {query.shape} and value {value.shape} must agree "
                             f"on the batch axis and the axes not attended over "
                             f"{tuple(batch)}")

    def _combined_mask(self, query: Tensor, value: Tensor, query_mask: Any, value_mask: Any,
                       key_mask: Any, attention_mask: Any, use_causal_mask: bool,
                       target: tuple[int, ...]) -> Tensor | None:
        """The AND of every mask given, as a bool tensor broadcastable to the scores' shape
        ``target`` (``(B, H, T, S)`` for rank-3 inputs). Each mask first gets the head axis
        Keras' way (axes inserted before the query's attention axes), so that a
        ``(B, H, T, S)`` attention mask combines with a causal ``(1, T, S)`` one."""
        where = f"MultiHeadAttention {self.name!r}"
        n_att = len(self._attention_axes or ())
        masks: list[Tensor] = []
        per_position = (("query_mask", query_mask, -1), ("value_mask", value_mask, -2),
                        ("key_mask", key_mask, -2))
        if query.ndim != 3 and any(m is not None for _, m, _ in per_position):
            raise NotImplementedError(f"{where}: query_mask, value_mask and key_mask are "
                                      "supported for rank-3 inputs (B, T, dim); got query of "
                                      f"shape {query.shape} (pass an attention_mask instead)")
        if use_causal_mask and self._attention_axes != (1,):
            # Keras' causal mask is (1, query.shape[1], value.shape[1]): it fits axis 1 only
            raise NotImplementedError(f"{where}: use_causal_mask needs attention over axis 1 "
                                      f"(attention_axes=(1,)), got attention_axes "
                                      f"{self._attention_axes}; pass an attention_mask instead")
        b, t, s = query.shape[0], query.shape[1], value.shape[1]
        for arg, mask, axis in per_position:
            if mask is None:
                continue
            m = self._bool(mask)
            want = (b, t) if arg == "query_mask" else (b, s)
            if m.ndim != 2 or any(d not in (1, w) for d, w in zip(m.shape, want)):
                raise ValueError(f"{where}: {arg} must have shape (batch, "
                                 f"{'T' if arg == 'query_mask' else 'S'}) = {want}, got "
                                 f"{m.shape}")
            masks.append(ops.expand_dims(m, axis))        # (B, T, 1) or (B, 1, S)
        if use_causal_mask:
            # position i of the query attends to positions j <= i: Keras' lower-triangular
            # (1, T, S) mask, T != S allowed as in Keras
            masks.append(_causal_mask(t, s, query.backend))
        if attention_mask is not None:
            masks.append(self._bool(attention_mask))
        if not masks:
            return None
        rank = len(target)
        keep: Tensor | None = None
        for m in masks:
            if not 2 * n_att <= m.ndim <= rank:
                raise ValueError(self._mask_error(m.shape, target))
            while m.ndim < rank:
                m = ops.expand_dims(m, -2 * n_att - 1)   # Keras' expansion axis
            if any(d not in (1, w) for d, w in zip(m.shape, target)):
                raise ValueError(self._mask_error(m.shape, target))
            keep = m if keep is None else ops.logical_and(keep, m)
        return keep

    def _mask_error(self, shape: tuple[int, ...], target: tuple[int, ...]) -> str:
        heads = len(target) - 2 * len(self._attention_axes or ()) - 1
        without_heads = target[:heads] + target[heads + 1:]
        return (f"MultiHeadAttention {self.name!r}: attention_mask must broadcast to "
                f"{without_heads} (batch, <query axes>, <key axes>) or {target} (with the "
                f"{target[heads]} heads), each axis equal or 1; got a mask of shape {shape}")

    @staticmethod
    def _bool(mask: Any) -> Tensor:
        """A mask as bool: Keras casts to bool, so any nonzero value attends."""
        m = mask if isinstance(mask, Tensor) else ops.convert_to_tensor(mask)
        return m if m.dtype == "bool" else ops.not_equal(m, 0)

    # --- config -----------------------------------------------------------------------------
    def get_config(self) -> dict[str, Any]:
        return {**super().get_config(), "num_heads": self._num_heads, "key_dim": self._key_dim,
                "value_dim": self._value_dim, "dropout": self._dropout,
                "use_bias": self._use_bias, "output_shape": self._output_shape,
                "attention_axes": self._attention_axes,
                "kernel_initializer": self._kernel_initializer,
                "bias_initializer": self._bias_initializer,
                **dict.fromkeys(_UNSUPPORTED), "seed": self.seed}


_CAUSAL: dict[tuple[int, int, str], Tensor] = {}


def _causal_mask(t: int, s: int, backend: Any) -> Tensor:
    """The (1, t, s) lower-triangular mask, made once per lengths and backend (a Python loop
    over t*s positions per call would cost more than the attention at small sizes)."""
    key = (t, s, backend.name)
    mask = _CAUSAL.get(key)
    if mask is None or mask.backend is not backend:
        mask = ops.constant([[[j <= i for j in range(s)] for i in range(t)]], "bool",
                            backend=backend)
        _CAUSAL[key] = mask
    return mask
