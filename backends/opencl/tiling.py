"""GEMM shapes (vector width, register block, work-group, what is read in place) as pure
functions of an OpenCL device description, so that they can be tested for devices that are not
here.

The vector width is where devices differ most, and where a driver may report more than its
compiler can build: PoCL 3.0 (LLVM 14) on an AMD Zen 4 reports 16-wide floats (the CPU has
AVX-512) but compiles for LLVM's ``znver3``, which has no AVX-512, and a 16-wide ``mad()``
(which the packed GEMM called until it stopped calling builtins) then aborts LLVM; 16-wide
vectors of plain arithmetic build, as two AVX2 registers each. So the width a device reports
is only where the search starts:
:mod:`mpcore_opencl.probe` builds and runs the GEMM in a subprocess at that width and, if it
fails, at each narrower one (:func:`candidate_widths`), and the backend uses the widest that
computed correctly.

- Packed (CPU devices): each work-item computes a ``rows`` x (``vectors`` x ``vector_width``)
  block of C in registers. The vector width is the device's; ``rows`` x ``vectors``
  accumulators and ``vectors`` B vectors must fit the vector registers (see
  :data:`PACKED_ROWS`).
- Tiled (GPUs): a work-group stages ``tile_m`` x ``tile_k`` and ``tile_k`` x ``tile_n`` slices
  in local memory; the vector width (4: 128-bit loads, which every GPU serves in one
  transaction, even those that report scalar floats as native) is a register block, not SIMD.
  Tiles shrink until the work-group and local memory fit what the device reports.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mpcore.core.backend import Device

#: The vector widths the GEMM kernels are written for (OpenCL C has no 3-wide loads there).
VECTOR_WIDTHS = (1, 2, 4, 8, 16)
#: Work-group of the packed GEMM, in (columns, rows) of register blocks, clamped to the
#: device's limits. The kernel has no barrier, so a group is only a unit of scheduling: on PoCL
#: on Zen 4, 4 x 1, 1 x 1 and 8 x 4 ran alike and 4 x 4 about 10% slower on the guide's
#: 128x784 @ 784x64 (benchmarks/packed_gemm_opencl.py --config group=...); small groups also
#: leave more groups than cores on small problems.
PACKED_GROUP = (4, 1)
#: Register block of the packed GEMM: ``PACKED_ROWS`` rows of two vectors of at most 32 bytes
#: (:func:`packed_vectors`): 12 accumulators and 2 B vectors, which fit AVX2's 16 registers.
#: On PoCL on Zen 4 (AVX2), 6 x 16 floats was fastest on the guide's shapes and on squares to
#: 1024, ahead of 4 x 16 (as fast on the guide's forward GEMM, up to 10% slower elsewhere),
#: 8 x 8, 3 x 32 and 8 x 16 (16 accumulators and the B vectors: spilled), benchmarks/
#: packed_gemm_opencl.py --config rows=...
PACKED_ROWS = 6
#: Widest vector, in bytes, that the packed GEMM counts as one register: AVX2's. A device may
#: report wider vectors than its compiler targets (PoCL 3.0 on Zen 4 reports 16 floats, AVX-512,
#: and compiles for znver3, AVX2), so a wider vector is taken to be several registers.
PACKED_REGISTER_BYTES = 32
#: Largest A and B (per batch) that the packed GEMM reads in place rather than packing. In
#: place, every row of blocks reads all of B again, a block's K rows of B each CW columns at a
#: stride of a whole row, and a block reads WPM rows of A (or, transposed, WPM columns: K short
#: runs at a stride of a row); that is faster than packing while the operand stays in L2, and
#: slower beyond. On PoCL on Zen 4 (1 MiB L2 a core), B in place was faster up to 256 KiB
#: (784x64, the guide's first layer; 256x256; 1024x64) and slower from 512 KiB (362x362,
#: 512x512); A in place was faster up to 512 KiB (the guide's 128x784, untransposed and
#: transposed), mixed around 512 KiB to 4 MiB (transposed slower, untransposed a few percent
#: faster) and slower at 16 MiB (2048x2048, transposed 2.7x). Measured with
#: benchmarks/packed_gemm_opencl.py --config a=...,b=... (0: always packed). Devices do not
#: report their L2 (PoCL reports the 32 MiB L3 as its global memory cache), so these are
#: constants.
PACKED_IN_PLACE_A_BYTES = 512 * 1024
PACKED_IN_PLACE_B_BYTES = 256 * 1024
TILED_WIDTH = 4


def _details(device: Device) -> Mapping[str, Any]:
    return device.details or {}


def gemm_variant(device: Device) -> str:
    """"packed" on CPU devices (their caches do the staging), "tiled" (local memory) elsewhere."""
    return "packed" if device.kind == "cpu" else "tiled"


def widest_width(limit: int) -> int:
    """The widest of :data:`VECTOR_WIDTHS` not above ``limit`` (1 for 0 or less)."""
    return max((w for w in VECTOR_WIDTHS if w <= limit), default=1)


def reported_width(device: Device) -> int:
    """The float vector width the device reports as native (else preferred), as one of
    :data:`VECTOR_WIDTHS`."""
    details = _details(device)
    width = int(details.get("native_vector_width_float", 0) or 0)
    if width <= 0:
        width = int(details.get("preferred_vector_width_float", 0) or 0)
    return widest_width(width)


def candidate_widths(device: Device) -> tuple[int, ...]:
    """The GEMM vector widths to try on ``device``, widest first: from what it reports
    (packed) or :data:`TILED_WIDTH` (tiled) down to 1."""
    start = reported_width(device) if gemm_variant(device) == "packed" else TILED_WIDTH
    return tuple(w for w in reversed(VECTOR_WIDTHS) if w <= start)


def _group_limits(device: Device) -> tuple[int, int, int]:
    """(max work-group size, max items along dimension 0, along dimension 1)."""
    details = _details(device)
    total = int(details.get("max_work_group_size", 0) or 0) or 256
    sizes = [*(details.get("max_work_item_sizes") or ()), total, total]
    return total, int(sizes[0]) or total, int(sizes[1]) or total


@dataclass(frozen=True)
class PackedShape:
    """The packed GEMM's shape: a register block of ``rows`` x ``columns`` per work-item
    (``vectors`` vectors of ``vector_width`` lanes a row), work-groups of ``group``
    (columns, rows) blocks at most, A and B read in place up to ``in_place_a_bytes`` and
    ``in_place_b_bytes`` per batch."""

    vector_width: int
    rows: int = PACKED_ROWS
    vectors: int = 2
    group: tuple[int, int] = PACKED_GROUP
    in_place_a_bytes: int = PACKED_IN_PLACE_A_BYTES
    in_place_b_bytes: int = PACKED_IN_PLACE_B_BYTES

    @property
    def columns(self) -> int:
        return self.vectors * self.vector_width

    def options(self) -> tuple[str, ...]:
        return ("-DPACKED", f"-DWPM={self.rows}", f"-DVW={self.vector_width}",
                f"-DNV={self.vectors}")


@dataclass(frozen=True)
class TiledShape:
    """The tiled GEMM's shape: ``tile_m`` x ``tile_n`` of C per work-group, ``tile_k``-deep
    local-memory slices, a ``rows`` x ``vector_width`` register block per work-item."""

    tile_m: int = 64
    tile_n: int = 64
    tile_k: int = 16
    rows: int = 8
    vector_width: int = TILED_WIDTH

    @property
    def group(self) -> tuple[int, int]:
        """Work-items per group along (columns, rows)."""
        return self.tile_n // self.vector_width, self.tile_m // self.rows

    def local_bytes(self, itemsize: int) -> int:
        """Local memory of one work-group: the A slice and the padded B slice."""
        return self.tile_k * (self.tile_m + self.tile_n + self.vector_width) * itemsize

    def options(self) -> tuple[str, ...]:
        return (f"-DTSM={self.tile_m}", f"-DTSN={self.tile_n}", f"-DTSK={self.tile_k}",
                f"-DWPM={self.rows}", f"-DVW={self.vector_width}")


def packed_shape(device: Device, vector_width: int, itemsize: int = 4) -> PackedShape:
    """The packed shape for accumulators of ``itemsize`` bytes, given the 32-bit vector width
    ``vector_width`` (one of :data:`VECTOR_WIDTHS`) that works on the device: the same vector
    bytes, so float64 gets half the lanes (a 16-wide float vector and an 8-wide double vector
    need the same registers, and fail to compile the same way); the work-group halved until
    it fits the device's limits."""
    if vector_width not in VECTOR_WIDTHS:
        raise ValueError(f"vector width {vector_width} is not one of {VECTOR_WIDTHS}")
    vector_width = widest_width(vector_width * 4 // itemsize)
    total, max_x, max_y = _group_limits(device)
    gx, gy = PACKED_GROUP
    while gx * gy > total or gx > max_x or gy > max_y:
        if gx >= gy and gx > 1:
            gx //= 2
        elif gy > 1:
            gy //= 2
        else:
            break
    return PackedShape(vector_width, vectors=packed_vectors(vector_width, itemsize),
                       group=(gx, gy))


def packed_vectors(vector_width: int, itemsize: int = 4) -> int:
    """Vectors of ``vector_width`` lanes of ``itemsize`` bytes per row of the packed GEMM's
    register block: two registers' worth (:data:`PACKED_REGISTER_BYTES` each), so two vectors
    up to that size and one wider vector (16 floats: two AVX2 registers, or one AVX-512)."""
    return 2 if vector_width * itemsize <= PACKED_REGISTER_BYTES else 1


def tiled_shape(device: Device, vector_width: int = TILED_WIDTH, itemsize: int = 4,
                acc_itemsize: int = 4) -> TiledShape:
    """The tiled shape given the 32-bit vector width that works on the device (at most
    :data:`TILED_WIDTH` columns per work-item, fewer lanes for 8-byte accumulators as in
    :func:`packed_shape`), its tiles halved until the work-group and its local memory
    (``itemsize`` bytes per staged value) fit what the device reports."""
    if vector_width not in VECTOR_WIDTHS:
        raise ValueError(f"vector width {vector_width} is not one of {VECTOR_WIDTHS}")
    vector_width = widest_width(vector_width * 4 // acc_itemsize)
    total, max_x, max_y = _group_limits(device)
    local = int(_details(device).get("local_memory_bytes", 0) or 0) or 32 * 1024
    shape = TiledShape(vector_width=min(vector_width, TILED_WIDTH))
    while True:
        gx, gy = shape.group
        fits = gx * gy <= total and gx <= max_x and gy <= max_y
        if fits and shape.local_bytes(itemsize) <= local:
            return shape
        if shape.tile_k > 4 and fits:  # only local memory is short: thinner slices first
            shape = TiledShape(shape.tile_m, shape.tile_n, shape.tile_k // 2, shape.rows,
                               shape.vector_width)
        elif shape.tile_m > shape.rows:
            shape = TiledShape(shape.tile_m // 2, shape.tile_n, shape.tile_k, shape.rows,
                               shape.vector_width)
        elif shape.tile_n > shape.vector_width:
            shape = TiledShape(shape.tile_m, shape.tile_n // 2, shape.tile_k, shape.rows,
                               shape.vector_width)
        else:
            raise ValueError(f"OpenCL device {device.name!r} is too small for the tiled GEMM: "
                             f"work-groups of {total} items, {local} bytes of local memory")
