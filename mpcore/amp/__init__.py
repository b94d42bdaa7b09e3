"""Automatic mixed precision for float32 models: TF's graph rewrite on traced steps
(:mod:`mpcore.amp.rewrite`) and PyTorch-style ``autocast`` (:mod:`mpcore.amp.autocast`), from
one set of editable op lists (:mod:`mpcore.amp.lists`), coloured by TF's painting pass
(:mod:`mpcore.amp.painting`), in the device's fast 16-bit dtype (:mod:`mpcore.amp.target`).
The public names are re-exported by :mod:`mpcore.mixed_precision`."""
