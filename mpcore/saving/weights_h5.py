"""The weights file, Keras 3's ``model.weights.h5`` layout (``saving_lib._save_state``).

Every saveable object has a group ``<path>/vars`` (``vars`` at the root), with its name as the
attribute ``name`` and its own variables as datasets ``"0"``, ``"1"`` ... in its creation
order. A model's layers lie under ``layers/<class in snake case>`` (``dense``, ``dense_1``
...: by class and position, never by the layer's own name, which is not reproducible), a
layer's sublayers under their attribute names (MultiHeadAttention: ``query_dense`` ...), the
optimizer under ``optimizer``: ``iterations``, the learning rate (unless a schedule), then the
slots in Keras' order (Adam: each variable's momentum and velocity in turn; RMSprop: every
velocity, then every momentum; SGD: the momentums); a LossScaleOptimizer writes its step
counter and scale after its own two, then its inner optimizer's variables, which
``optimizer/inner_optimizer`` holds again.

Loading reads and checks everything first (every path, count and shape) and assigns only
then, so a file that does not fit leaves the model as it was.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from mpcore.layers.base import Layer
from mpcore.saving import keras_names, keras_ops, model_config

#: mpcore attribute -> Keras path of a built-in layer's sublayers (Keras walks properties)
_SUBLAYER_PATHS = {"_query_dense": "query_dense", "_key_dense": "key_dense",
                   "_value_dense": "value_dense", "_output_dense": "output_dense"}
# a model's bookkeeping that holds layers Keras reaches through "layers" (or not at all)
_SKIPPED = {"_layers", "_stack", "_nodes", "_inbound_nodes", "_input_tensor", "_last",
            "_graph_inputs", "_graph_outputs", "_flat_inputs", "_flat_outputs", "_traced"}


@dataclass
class Slot:
    """One dataset: its shape, how to read it for saving and how to set it when loading."""

    what: str
    shape: tuple[int, ...]
    read: Callable[[], Any]
    write: Callable[[Any], None]
    dtype: str = "float32"


@dataclass
class Entry:
    path: str
    name: str | None
    slots: list[Slot] = field(default_factory=list)


def _variable_slot(var: Any) -> Slot:
    return Slot(var.name, tuple(var.shape), var.numpy, var.assign, var.dtype)


def _name_key(name: str) -> str:
    """Keras' order of attributes: private ones last."""
    return f"~{name}" if name.startswith("_") else name


def _join(path: str, name: str) -> str:
    return f"{path}/{name}" if path else name


def _unique(name: str, used: dict[str, int]) -> str:
    if name in used:
        used[name] += 1
        return f"{name}_{used[name]}"
    used[name] = 0
    return name


def entries(model: Any, include_optimizer: bool = True) -> list[Entry]:
    """Every group of ``model``'s weights file, in Keras' walk order."""
    out: list[Entry] = []
    visited: set[int] = set()
    _walk_layer(model, "", out, visited)
    optimizer = getattr(model, "optimizer", None)
    if include_optimizer and optimizer is not None:
        out += optimizer_entries(optimizer, model.trainable_variables, "optimizer")
    return out


def _path_name(layer: Layer) -> str:
    """The group of a layer in a container: its Keras class name in snake case (a
    functional model is Keras' ``Functional``)."""
    known = keras_names.keras_name(layer)
    return keras_names.to_snake_case(known[1] if known else type(layer).__name__)


def _walk_layer(layer: Layer, path: str, out: list[Entry], visited: set[int]) -> None:
    if id(layer) in visited:
        return
    visited.add(id(layer))
    out.append(Entry(path, layer.name, [_variable_slot(v) for v in layer._weights]))
    if getattr(layer, "_is_graph", False):
        used: dict[str, int] = {}
        # Keras' order: a Sequential's stack, a functional model's layers by depth
        children = (layer.layers if isinstance(layer, keras_names.model_class("Sequential"))
                    else model_config.keras_order(layer))
        for child in children:       # named before the visited check, as Keras counts
            if keras_ops.is_operator(child):
                continue             # Keras' operations are not layers: no group
            name = _unique(_path_name(child), used)
            _walk_layer(child, _join(path, f"layers/{name}"), out, visited)
    for attr in sorted(vars(layer), key=_name_key):
        if attr in _SKIPPED:
            continue
        value = vars(layer)[attr]
        name = _SUBLAYER_PATHS.get(attr, attr)
        if isinstance(value, Layer):
            _walk_layer(value, _join(path, name), out, visited)
        elif isinstance(value, (list, tuple, dict)):
            items = list(value.values()) if isinstance(value, dict) else list(value)
            used = {}
            for item in items:
                if isinstance(item, Layer):
                    child = _unique(_path_name(item), used)
                    _walk_layer(item, _join(path, f"{name}/{child}"), out, visited)


# --- optimizers ---------------------------------------------------------------------------------
def optimizer_entries(optimizer: Any, var_list: list[Any], path: str) -> list[Entry]:
    """The optimizer's groups, its slots built for ``var_list`` (Keras builds them for the
    model's trainable variables, in that order)."""
    from mpcore.optimizers.loss_scale_optimizer import LossScaleOptimizer

    if isinstance(optimizer, LossScaleOptimizer):
        inner = optimizer.inner_optimizer
        inner_slots = _optimizer_slots(inner, var_list)
        scale = optimizer.loss_scale
        own = [_iterations_slot(optimizer),
               Slot("learning_rate", (), lambda: 0.0, lambda v: None),
               Slot("step_counter", (), lambda: optimizer.dynamic_counter or 0,
                    lambda v: _set_scale_state(scale, "num_good_steps", v), "int64"),
               Slot("dynamic_scale", (), lambda: float(scale()),
                    lambda v: _set_scale_state(scale, "current_loss_scale", v))]
        return [Entry(path, optimizer.name, own + inner_slots),
                Entry(_join(path, "inner_optimizer"), inner.name, inner_slots)]
    return [Entry(path, optimizer.name, _optimizer_slots(optimizer, var_list))]


def _iterations_slot(optimizer: Any) -> Slot:
    """Keras' ``iterations``: the calls of ``apply``. mpcore counts the updates, and the
    micro-steps of a gradient accumulation apart: N updates and k micro-steps are N*steps + k
    calls (Keras 3's count; its accumulators hold the sum of the k gradients, as mpcore's)."""
    inner = getattr(optimizer, "inner_optimizer", optimizer)

    def steps() -> int:
        return inner.gradient_accumulation_steps or 1

    def read() -> int:
        return int(inner.iterations) * steps() + inner._micro_steps

    def write(value: Any) -> None:
        inner.iterations, inner._micro_steps = divmod(int(value), steps())

    return Slot("iterations", (), read, write, "int64")


def _to_float32(value: float) -> float:
    return float(struct.unpack("f", struct.pack("f", value))[0])


def _set_scale_state(scale: Any, key: str, value: Any) -> None:
    from mpcore.mixed_precision import loss_scale as _ls

    if not isinstance(scale, _ls.DynamicLossScale):
        return        # a fixed scale has no state: its value is in the config
    state = scale.state_dict()
    state[key] = int(value) if key == "num_good_steps" else float(value)
    scale.load_state_dict(state)


def _optimizer_slots(optimizer: Any, var_list: list[Any]) -> list[Slot]:
    from mpcore import optimizers

    optimizer.build(var_list)
    slots = [_iterations_slot(optimizer)]
    if not callable(optimizer._learning_rate):
        def set_rate(value: Any) -> None:
            # the file holds the rate in float32; the config, read first, has it exactly:
            # a rate changed since (by a callback) is the file's, one not changed stays exact
            if _to_float32(optimizer.learning_rate) != float(value):
                optimizer.learning_rate = float(value)

        slots.append(Slot("learning_rate", (), lambda: float(optimizer.learning_rate),
                          set_rate))
    if (optimizer.gradient_accumulation_steps or 1) > 1:
        # Keras 3 builds the accumulators before the subclass's slots
        slots += [_variable_slot(optimizer._accumulator(v)) for v in var_list]
    names = optimizer.slot_names()

    def column(name: str) -> list[Slot]:
        return [_variable_slot(optimizer.get_slot(v, name)) for v in var_list]

    if isinstance(optimizer, optimizers.Adam):     # AdamW too: interleaved, as Keras builds
        slots += [_variable_slot(optimizer.get_slot(v, n)) for v in var_list for n in ("m", "v")]
    elif isinstance(optimizer, optimizers.RMSprop):
        slots += column("velocity") + (column("momentum") if "momentum" in names else [])
    elif isinstance(optimizer, optimizers.SGD):
        slots += column("momentum") if "momentum" in names else []
    else:    # another optimizer: its slots by variable, in its own slot order
        slots += [_variable_slot(optimizer.get_slot(v, n)) for v in var_list for n in names]
    return slots


# --- writing and reading ------------------------------------------------------------------------
def write(h5: Any, groups: list[Entry]) -> None:
    """Write ``groups`` into the open h5py file ``h5`` (Keras' H5IOStore layout)."""
    for entry in groups:
        group = h5.require_group(_join(entry.path, "vars"))
        if entry.name is not None:
            group.attrs["name"] = entry.name
        for i, slot in enumerate(entry.slots):
            value = slot.read()
            if slot.dtype == "bfloat16":
                dataset = group.create_dataset(str(i), data=value)
                dataset.attrs["dtype"] = "bfloat16"
            elif isinstance(value, (int, float)):
                group.create_dataset(str(i), data=value, dtype=slot.dtype)
            else:
                group.create_dataset(str(i), data=value)


def read(h5: Any) -> dict[str, list[Any]]:
    """Every ``vars`` group of the file: path -> its datasets' values, in index order."""
    import numpy as np  # the I/O boundary: h5py hands out NumPy arrays

    out: dict[str, list[Any]] = {}

    def visit(name: str, obj: Any) -> None:
        if name == "vars" or name.endswith("/vars"):
            if not hasattr(obj, "keys"):
                raise ValueError(f"{name!r} is a dataset, not a group of variables")
            keys = list(obj.keys())
            if sorted(keys, key=_index) != [str(i) for i in range(len(keys))]:
                raise ValueError(f"group {name!r} holds {sorted(keys)}: expected datasets "
                                 "named 0, 1, 2 ...")
            values = []
            for i in range(len(keys)):
                data = obj[str(i)]
                value = np.asarray(data[()])
                if data.attrs.get("dtype") == "bfloat16":
                    import ml_dtypes
                    value = value.view(ml_dtypes.bfloat16)
                values.append(value)
            out[name[:-len("vars")].rstrip("/")] = values

    h5.visititems(visit)
    if "vars" in h5 and "" not in out:
        visit("vars", h5["vars"])
    return out


def _index(key: str) -> int:
    return int(key) if key.isdigit() else -1


def plan(groups: list[Entry], stored: dict[str, list[Any]], source: str
         ) -> list[tuple[Slot, Any]]:
    """Match every slot of ``groups`` with its stored value, checking counts and shapes, and
    that the file holds no variables the model lacks. Raises one ValueError listing every
    mismatch; assigns nothing."""
    problems: list[str] = []
    assignments: list[tuple[Slot, Any]] = []
    seen = set()
    for entry in groups:
        values = stored.get(entry.path, [])
        seen.add(entry.path)
        where = f"{entry.path or 'the model'} ({entry.name})"
        if len(values) != len(entry.slots):
            problems.append(f"{where}: the file has {len(values)} variables, the model "
                            f"{len(entry.slots)} ({', '.join(s.what for s in entry.slots)})")
            continue
        for slot, value in zip(entry.slots, values):
            shape = tuple(getattr(value, "shape", ()))
            if shape != slot.shape:
                problems.append(f"{where}: {slot.what} has shape {slot.shape}, the file "
                                f"{shape}")
            else:
                assignments.append((slot, value))
    extra = sorted(p for p, values in stored.items() if values and p not in seen)
    if extra:
        problems.append("the file has variables for objects the model lacks: "
                        + ", ".join(extra))
    if problems:
        raise ValueError(f"the weights in {source} do not match the model (nothing was "
                         "loaded):\n  " + "\n  ".join(problems))
    return assignments


def assign(assignments: list[tuple[Slot, Any]]) -> None:
    for slot, value in assignments:
        slot.write(value)
