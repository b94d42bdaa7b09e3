"""The core: tensors and variables, autodiff's tape, dtypes and op categories, the random
streams, the Backend base class and kernel contract, and small helpers every package uses.
Nothing here imports a package above it (the one exception, autodiff's cycle with ``ops``, is
named in ``tests/core/test_import_graph.py``)."""
