"""What the NCCL engine needs before a GPU is touched, as pure functions: the NCCL dtype and
reduction of each mpcore name (NCCL's C enums, stable since NCCL 2.10), and the unique id
that rank 0 makes and every rank needs, carried over MPI as a list of floats."""

from __future__ import annotations

from collections.abc import Callable, Sequence

# ncclDataType_t
NCCL_DTYPES = {"int8": 0, "uint8": 1, "int32": 2, "uint32": 3, "int64": 4, "uint64": 5,
               "float16": 6, "float32": 7, "float64": 8, "bfloat16": 9}
# ncclRedOp_t
NCCL_OPS = {"sum": 0, "max": 2, "min": 3}
UNIQUE_ID_BYTES = 128


def nccl_dtype(name: str) -> int:
    if name not in NCCL_DTYPES:
        raise ValueError(f"NCCL cannot reduce {name!r} tensors; valid dtypes: "
                         f"{', '.join(NCCL_DTYPES)}")
    return NCCL_DTYPES[name]


def nccl_op(name: str) -> int:
    if name not in NCCL_OPS:
        raise ValueError(f"unknown reduction {name!r}; valid: {', '.join(NCCL_OPS)}")
    return NCCL_OPS[name]


def encode_unique_id(uid: Sequence[int]) -> list[float]:
    """NCCL's unique id (CuPy 13 gives a tuple of 128 signed or unsigned bytes, CuPy 14
    ``bytes``) as floats."""
    if len(uid) != UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(uid)}")
    return [float(b & 0xFF) for b in uid]


def decode_unique_id(values: Sequence[float]) -> tuple[int, ...]:
    """The unique id back, as the tuple of signed bytes CuPy 13's ``NcclCommunicator`` takes
    (CuPy 14's takes ``bytes``: the engine converts where the tuple is refused)."""
    if len(values) != UNIQUE_ID_BYTES:
        raise ValueError(f"an NCCL unique id has {UNIQUE_ID_BYTES} bytes, got {len(values)}")
    return tuple(int(v) - 256 if int(v) > 127 else int(v) for v in values)


def share_unique_id(rank: int, make: Callable[[], Sequence[int]],
                    broadcast: Callable[[list[float]], list[float]]) -> tuple[int, ...]:
    """Rank 0's ``make()``, on every rank: ``broadcast`` is a collective from rank 0 (the MPI
    engine's ``broadcast_values``); the other ranks send zeros, which it overwrites."""
    mine = encode_unique_id(make()) if rank == 0 else [0.0] * UNIQUE_ID_BYTES
    return decode_unique_id(broadcast(mine))
