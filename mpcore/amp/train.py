"""``tf.train``'s mixed precision names, for the code of TF 1.14-2.3 that uses them:
``mp.train.experimental.enable_mixed_precision_graph_rewrite(opt)`` is
:func:`mpcore.mixed_precision.enable_mixed_precision_graph_rewrite` (the graph rewrite of
traced steps, :mod:`mpcore.amp.rewrite`). Loaded on first use of ``mp.train``."""

from __future__ import annotations

import types

from mpcore.amp.rewrite import (
    disable_mixed_precision_graph_rewrite,
    enable_mixed_precision_graph_rewrite,
)

experimental = types.ModuleType(f"{__name__}.experimental",
                                "tf.train.experimental's mixed precision graph rewrite.")
experimental.enable_mixed_precision_graph_rewrite = (  # type: ignore[attr-defined]
    enable_mixed_precision_graph_rewrite)
experimental.disable_mixed_precision_graph_rewrite = (  # type: ignore[attr-defined]
    disable_mixed_precision_graph_rewrite)

__all__ = ["experimental"]
