"""The cuBLASLt constants, read from the CUDA headers rather than written down: where the headers
are found (next to the loaded library first) and a C ``enum`` parser that handles implicit
increments, hexadecimal and suffixed literals, and values defined by earlier enumerators.

Pure Python, no CuPy and no GPU: the tests parse the headers the CUDA wheels ship
(``nvidia-cublas-cu12``: ``cublasLt.h``, ``cublas_api.h``; ``nvidia-cuda-runtime-cu12``:
``library_types.h``) and pin the values against NVIDIA's documented ones.
"""

from __future__ import annotations

import ast
import importlib.util
import operator
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

#: Each header and the enumerators mpcore reads from it, in the order they are read (a later
#: header's values may name an earlier one's enumerators).
NEEDED: dict[str, tuple[str, ...]] = {
    "library_types.h": ("CUDA_R_32F", "CUDA_R_16BF", "CUDA_R_8F_E4M3", "CUDA_R_8F_E5M2"),
    "cublas_api.h": ("CUBLAS_COMPUTE_32F", "CUBLAS_OP_N", "CUBLAS_OP_T",
                     "CUBLAS_STATUS_SUCCESS", "CUBLAS_STATUS_NOT_SUPPORTED"),
    "cublasLt.h": ("CUBLASLT_MATMUL_DESC_TRANSA", "CUBLASLT_MATMUL_DESC_TRANSB",
                   "CUBLASLT_MATMUL_DESC_A_SCALE_POINTER", "CUBLASLT_MATMUL_DESC_B_SCALE_POINTER",
                   "CUBLASLT_MATMUL_DESC_FAST_ACCUM", "CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES"),
}
#: A folder (or several, os.pathsep-separated) of headers searched after the CUDA install's
#: own, e.g. headers carried to a machine whose wheels ship the library without them.
ENV_INCLUDE = "MPCORE_CUBLASLT_INCLUDE"


class HeaderError(RuntimeError):
    """A header is missing, or lacks an enumerator mpcore needs."""


_COMMENTS = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
_ENUM = re.compile(r"\benum\s*(\w*)\s*\{([^{}]*)\}\s*(\w*)", re.S)
_SUFFIX = re.compile(r"\b(0[xX][0-9a-fA-F]+|\d+)[uUlL]+\b")
_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
        ast.LShift: operator.lshift, ast.RShift: operator.rshift, ast.BitOr: operator.or_,
        ast.BitAnd: operator.and_, ast.BitXor: operator.xor}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos, ast.Invert: operator.invert}


def _evaluate(expr: str, known: Mapping[str, int]) -> int:
    """An enumerator's constant expression: integers (any C suffix), earlier enumerators,
    parentheses, + - * << >> | & ^ ~ and casts to an integer type are dropped."""
    text = _SUFFIX.sub(r"\1", expr.strip())
    text = re.sub(r"\(\s*(?:unsigned\s+)?(?:int|long|u?int\d+_t)\s*\)", "", text)
    tree = ast.parse(text, mode="eval")

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.Name) and node.id in known:
            return known[node.id]
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            return _OPS[type(node.op)](value(node.left), value(node.right))
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](value(node.operand))
        raise ValueError(f"cannot evaluate enumerator value {expr.strip()!r}")

    return value(tree)


def parse_enums(text: str, known: Mapping[str, int] | None = None) -> dict[str, dict[str, int]]:
    """Every ``enum`` of C source ``text``: its name (the tag, else the typedef name, else
    ``"<anonymous N>"``) -> {enumerator: value}, in the header's order. An enumerator without
    ``=`` is the previous one plus one (the first is 0); a value may name an enumerator defined
    before, in ``text`` or in ``known`` (another header's). Preprocessor lines inside an enum
    are skipped, as are attributes written as macros after a name. A value that cannot be
    evaluated (a name from a header not read) leaves that enumerator, and those that follow it
    implicitly, out."""
    text = _COMMENTS.sub(" ", text)
    enums: dict[str, dict[str, int]] = {}
    known = dict(known or {})
    for i, match in enumerate(_ENUM.finditer(text)):
        body = "\n".join(line for line in match.group(2).splitlines()
                         if not line.lstrip().startswith("#"))
        values: dict[str, int] = {}
        following: int | None = 0
        for item in body.split(","):
            item = item.strip()
            if not item:
                continue
            name, _, expr = item.partition("=")
            name = name.split()[0]
            if not re.fullmatch(r"[A-Za-z_]\w*", name):
                raise ValueError(f"cannot parse enumerator {item!r}")
            if expr.strip():
                try:
                    following = _evaluate(expr, {**known, **values})
                except (ValueError, SyntaxError):
                    following = None
            if following is not None:
                values[name] = following
                following += 1
        known.update(values)
        enums[match.group(1) or match.group(3) or f"<anonymous {i}>"] = values
    return enums


def enumerators(text: str, known: Mapping[str, int] | None = None) -> dict[str, int]:
    """Every enumerator of ``text`` in one mapping (``known``: those of headers read before)."""
    out: dict[str, int] = {}
    for values in parse_enums(text, known).values():
        out.update(values)
    return out


def _pathfinder_dirs() -> list[Path]:
    if importlib.util.find_spec("cuda.pathfinder") is None:
        return []
    from cuda import pathfinder

    found = []
    for lib in ("cublas", "cudart"):
        try:
            folder = pathfinder.find_nvidia_header_directory(lib)
        except Exception:  # any failure: the next place is searched
            folder = None
        if folder:
            found.append(Path(folder))
    return found


def header_dirs(library: str | os.PathLike[str] | None = None) -> list[Path]:
    """Where the headers are looked for, in order: ``include/`` beside the loaded library's
    ``lib/`` (the wheel's or the toolkit's own, so the constants match the library), the
    other NVIDIA wheels' ``include/`` folders (``library_types.h`` comes with the runtime's
    wheel), cuda-pathfinder's header folders, ``$CUDA_PATH``/``$CUDA_HOME``/``/usr/local/cuda``
    ``include``, then :data:`ENV_INCLUDE`."""
    dirs: list[Path] = []
    if library is not None:
        lib = Path(library).resolve().parent
        dirs.append(lib.parent / "include")
        dirs += sorted(lib.parent.parent.glob("*/include"))    # site-packages/nvidia/*/include
    dirs += _pathfinder_dirs()
    dirs += [Path(os.environ[v]) / "include" for v in ("CUDA_PATH", "CUDA_HOME")
             if os.environ.get(v)]
    dirs.append(Path("/usr/local/cuda/include"))
    dirs += [Path(p) for p in os.environ.get(ENV_INCLUDE, "").split(os.pathsep) if p]
    return list(dict.fromkeys(dirs))


def find_header(name: str, dirs: Sequence[Path]) -> Path:
    """The first ``dirs/name``; a HeaderError naming every folder searched."""
    for folder in dirs:
        if (folder / name).is_file():
            return folder / name
    searched = ", ".join(map(str, dirs)) or "no folder"
    raise HeaderError(f"{name} not found (searched: {searched}); it ships with the CUDA wheels "
                      "(pip install nvidia-cublas-cu12 nvidia-cuda-runtime-cu12) or a CUDA "
                      f"toolkit, or put it in a folder named by {ENV_INCLUDE}")


def read_constants(dirs: Iterable[Path],
                   needed: Mapping[str, Sequence[str]] | None = None) -> dict[str, int]:
    """The enumerators of every header of ``needed`` (default :data:`NEEDED`), each header
    read from the first of ``dirs`` that has it; a HeaderError where a header is missing or
    lacks a name that is needed."""
    dirs = list(dirs)
    out: dict[str, int] = {}
    for header, names in (NEEDED if needed is None else needed).items():
        path = find_header(header, dirs)
        values = enumerators(path.read_text(encoding="utf-8", errors="replace"), out)
        missing = [n for n in names if n not in values]
        if missing:
            raise HeaderError(f"{path} has no {', '.join(missing)}")
        out.update(values)
    return out


def status_names(constants: Mapping[str, int]) -> dict[int, str]:
    """cuBLAS status code -> name (``CUBLAS_STATUS_*``), for error messages."""
    return {v: k for k, v in reversed(list(constants.items()))
            if k.startswith("CUBLAS_STATUS_")}
