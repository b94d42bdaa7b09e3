"""What autocast and the graph rewrite refuse because something else also sets dtypes (issue
18, defects 1, 3, 4, 20): a layer's own mixed policy, a mixed policy set inside an autocast
block, autocast and the rewrite together; and errors that say where a policy came from."""

from __future__ import annotations

import pytest
from amp_models import X, Y, rewrite_off  # noqa: F401 - rewrite_off: autouse

import mpcore as mp

MP = mp.mixed_precision


def _dense_model() -> mp.Model:
    return mp.models.Sequential([mp.layers.Dense(8, activation="relu"), mp.layers.Dense(4),
                                 mp.layers.Activation("softmax", dtype="float32")])


def test_the_rewrite_refuses_a_model_built_under_a_mixed_policy_scope() -> None:
    """Defect 1: policy_scope got past the rewrite's check, which then ran the model in
    float32 with useless cast round trips."""
    opt = MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD())
    with mp.policy_scope("mixed_float16"):
        model = _dense_model()
    model.compile(loss="sparse_categorical_crossentropy", optimizer=opt, jit_compile=True)
    with pytest.raises(ValueError, match=r"layer '\w+' has the mixed policy 'mixed_float16'.*"
                                         r"the mixed precision graph rewrite runs float32"):
        model.fit(X, Y, batch_size=32, epochs=1, verbose=0)


def test_the_rewrite_refuses_to_start_inside_a_mixed_policy_scope() -> None:
    """Defect 20: the message said "the global policy" for a policy_scope."""
    with mp.policy_scope("mixed_float16"), \
            pytest.raises(ValueError, match=r"'mixed_float16' \(a policy_scope\).*leave the "
                                            r"policy_scope"):
        MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD())


def test_autocast_refuses_a_layer_with_its_own_mixed_policy() -> None:
    """Defect 3: autocast silently overrode a layer's mixed policy."""
    x = mp.constant(X[:4])
    dense = mp.layers.Dense(8, dtype="mixed_float16")
    assert dense(x).dtype == "float16"
    with MP.autocast("bfloat16"), \
            pytest.raises(ValueError, match=r"has the mixed policy 'mixed_float16'.*autocast"):
        dense(x)
    with MP.autocast("float16"), mp.policy_scope("mixed_float16"), pytest.raises(ValueError):
        mp.layers.Dense(8)(x)                 # built under the scope: a mixed layer too
    with MP.autocast("float16"):             # a float32 model is what autocast is for
        assert mp.layers.Dense(8)(x).dtype == "float16"


def test_no_mixed_global_policy_inside_autocast() -> None:
    """Defect 3: set_global_policy("mixed_bfloat16") was accepted inside an autocast block."""
    with MP.autocast("bfloat16"), \
            pytest.raises(ValueError, match=r"'mixed_bfloat16' inside an autocast block"):
        MP.set_global_policy("mixed_bfloat16")
    assert MP.global_policy().name == "float32"


def test_autocast_and_the_rewrite_are_not_combined() -> None:
    """Defect 4: autocast's dtype was ignored under the rewrite, without a word."""
    MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD())
    with pytest.raises(ValueError, match=r"autocast and the mixed precision graph rewrite"), \
            MP.autocast("float16"):
        pass
    MP.disable_mixed_precision_graph_rewrite()
    with MP.autocast("float16"), pytest.raises(ValueError, match=r"inside an autocast block"):
        MP.enable_mixed_precision_graph_rewrite(mp.optimizers.SGD())


def test_a_bad_autocast_dtype_is_an_error_when_the_block_is_made() -> None:
    """Defect 19: autocast("int8") was only checked on entering the block."""
    with pytest.raises(ValueError, match=r"dtype must be one of float16, bfloat16"):
        MP.autocast("int8")
    scope = MP.autocast("bfloat16")
    with scope as s:
        assert len(repr(s)) < 120            # the lists' repr is short too
    assert mp.ops.matmul(mp.constant(X[:2]), mp.constant(X[:2].T)).dtype == "float32"
