"""Checkpoints: weights, optimizer slots and iterations, loss-scale state, the training step and
epoch, and ``mp.random``'s state, so a resumed run repeats an uninterrupted one exactly (dropout
masks and shuffles included).

The file is a 48-byte header (``MAGIC``, the length of the data, its SHA-256) followed by a
pickle of plain Python values and the host arrays the backend hands out (``t.numpy()``), so the
core needs no array library to write it. Everything restored lies under the checksum, which is
checked before anything is unpickled: a flipped bit or a cut-short copy is an error naming the
file, never a silently wrong weight. Files from before the checksum (a bare pickle) still load,
with a warning. Saves are atomic: to a temporary file in the same folder (created with mode
0666 less the umask, as ``np.save``), flushed and fsynced, then ``os.replace``-d over the
target, so a crash mid-write leaves the previous file (or none), never a broken one. The
temporary file's name holds this machine's name, PID namespace and the saving process's ID, so
a later save in the folder removes those of saves that were killed. A path that cannot be saved
to (a folder, a read-only place, a full disk) is an OSError of the type the OS gave, naming that
path and why, not the temporary file. Only load checkpoints you trust: unpickling runs code.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import pickle
import re
import secrets
import socket
import struct
from collections.abc import Callable
from typing import Any

from mpcore.core import random as _random
from mpcore.distribution import api as _distribution
from mpcore.distribution import faults as _faults

logger = logging.getLogger("mpcore")

FORMAT = "mpcore.checkpoint"
WEIGHTS_FORMAT = "mpcore.weights"
VERSION = 1
# the container: magic (its first byte is far from 0x80, the first byte of an old bare pickle),
# then the data's length and SHA-256
MAGIC = b"mpcore\x00\x02"
HEADER = struct.Struct(">8sQ32s")
REQUIRED = {FORMAT: ("names", "values", "optimizer", "random", "train_step", "extra"),
            WEIGHTS_FORMAT: ("names", "values")}
_CHUNK = 1 << 20
# ".<target>.mpcore.<owner>.<pid>.<8 hex>.tmp", as _create_temporary names them
_TEMPORARY = re.compile(r"\..+\.mpcore\.(?P<owner>[A-Za-z0-9-]+)\.(?P<pid>[0-9]+)"
                        r"\.[0-9a-f]{8}\.tmp")


class _HashingWriter:
    """A file's ``write`` that also feeds the SHA-256 and counts the bytes."""

    def __init__(self, f: Any) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data: Any) -> int:
        view = memoryview(data).cast("B")
        self.sha.update(view)
        self.size += view.nbytes
        return self.f.write(view)


def _owner() -> str:
    """This machine and PID namespace: a PID in a temporary file's name means something only
    to processes that share both (a folder may be shared over the network or with containers)."""
    host = re.sub(r"[^A-Za-z0-9]", "-", socket.gethostname())[:32] or "host"
    try:
        return f"{host}-{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return host


def _certainly_dead(pid: int) -> bool:
    if os.name != "posix" or pid <= 0 or pid == os.getpid():
        return False  # os.kill(pid, 0) terminates the process on Windows
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except (OSError, OverflowError):
        return False  # EPERM: it runs under another user
    return False


def remove_stale_temporaries(folder: str | os.PathLike[str]) -> list[str]:
    """Remove the temporary files that saves killed mid-write (SIGKILL, power loss) left in
    ``folder``: only those named by a save on this machine whose process no longer runs, so a
    concurrent live save's file is never touched. Returns the paths removed."""
    removed = []
    owner = _owner()
    with os.scandir(folder) as entries:
        for entry in entries:
            match = _TEMPORARY.fullmatch(entry.name)
            if (match is None or match["owner"] != owner
                    or not entry.is_file(follow_symlinks=False)
                    or not _certainly_dead(int(match["pid"]))):
                continue
            try:
                os.unlink(entry.path)
                removed.append(entry.path)
            except FileNotFoundError:  # another save removed it first
                pass
            except OSError as exc:  # e.g. another user's, in a sticky folder: not ours to fix
                logger.warning("could not remove %s, a temporary file of a killed save: %s",
                               entry.path, exc)
    if removed:
        logger.info("removed %d temporary file(s) of killed saves: %s", len(removed),
                    ", ".join(removed))
    return removed


def _create_temporary(target: str) -> tuple[int, str]:
    folder, base = os.path.split(target)
    prefix = os.path.join(folder, f".{base}.mpcore.{_owner()}.{os.getpid()}.")
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0)
    while True:
        tmp = prefix + secrets.token_hex(4) + ".tmp"
        with contextlib.suppress(FileExistsError):
            # mode 0666: the kernel applies the umask, as for np.save's files
            return os.open(tmp, flags, 0o666), tmp


def atomic_write(path: str | os.PathLike[str], payload: Any) -> None:
    """Pickle ``payload`` to ``path`` under the checksummed header, atomically (temp file +
    fsync + os.replace); first removes temporary files that killed saves left in its folder.
    Under a distribution it is called on every rank (as fit is): rank 0 writes (the ranks hold
    the same state) and every rank waits until the file is complete, so a restore right after
    reads it."""
    write_on_rank_zero(path, lambda f: _write_payload(f, payload),
                       "save_weights/save_checkpoint")


def write_on_rank_zero(path: str | os.PathLike[str], write: Callable[[Any], None],
                       calls: str) -> None:
    """``write(file)`` into ``path`` atomically (:func:`write_file`); under a distribution
    rank 0 writes and every rank waits until the file is complete. ``calls`` names the
    methods every rank must call (the wait's timeout message says so)."""
    dist = _distribution.distribution()
    if dist is None or dist.rank == 0:
        write_file(path, write)
    if dist is not None:
        # the wait's name is in its timeout message: `if rank() == 0: model.save_weights(p)`
        # is the usual cause, so the message says what to do instead
        _faults.agree(dist.engine, f"rank 0 writing {os.fspath(path)}; under a distribution "
                      f"every rank calls {calls}, not rank 0 alone", (), [])


def _refused(path: str, what: str, exc: OSError) -> OSError:
    """``exc`` (same type and errno) told about the user's ``path``: the OS names the temporary
    file or the folder, which the user never gave."""
    reason = str(exc) if exc.strerror is None else exc.strerror
    error = type(exc)(f"cannot save to {path!r}: {what}" + (f": {reason}" if reason else ""))
    error.errno = exc.errno
    return error


def write_file(path: str | os.PathLike[str], write: Callable[[Any], None]) -> None:
    """``write(file)`` into a temporary file beside ``path``, fsynced, then ``os.replace``-d
    over it (see the module's docstring); the folder's stale temporaries removed first. An
    OSError names ``path`` and why, in the type the OS gave."""
    shown = os.fspath(path)
    target = os.path.abspath(shown)
    folder = os.path.dirname(target)
    if os.path.isdir(target):
        raise _refused(shown, "it is a folder; give a file name in it, e.g. "
                       f"{os.path.join(shown, 'weights.mpcore')!r}",
                       IsADirectoryError(errno.EISDIR, ""))
    if os.path.exists(folder) and not os.path.isdir(folder):
        raise _refused(shown, f"{folder!r}, where it would go, is a file, not a folder",
                       NotADirectoryError(errno.ENOTDIR, ""))
    try:
        os.makedirs(folder, exist_ok=True)
        remove_stale_temporaries(folder)
        fd, tmp = _create_temporary(target)
    except OSError as exc:
        raise _refused(shown, f"cannot create a file in its folder {folder!r}", exc) from exc
    try:
        _write_temporary(fd, tmp, target, write)
    except OSError as exc:
        raise _refused(shown, "writing it failed", exc) from exc


def _write_temporary(fd: int, tmp: str, target: str, write: Callable[[Any], None]) -> None:
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _write_payload(f: Any, payload: Any) -> None:
    """The checksummed container: the header's place, the pickle (hashed as it is written),
    then the header."""
    f.write(bytes(HEADER.size))
    body = _HashingWriter(f)
    pickle.dump(payload, body, protocol=pickle.HIGHEST_PROTOCOL)
    f.seek(0)
    f.write(HEADER.pack(MAGIC, body.size, body.sha.digest()))


def _verify(f: Any, path: str, expected: str) -> None:
    """Check the header and the SHA-256 of what follows it; leaves ``f`` at the data."""
    damaged = (f"{path!r} is damaged (changed or cut short after it was written: a disk, copy "
               f"or transfer error); restore it from a copy or load an earlier checkpoint")
    head = f.read(HEADER.size)
    if len(head) < HEADER.size:
        raise ValueError(f"{damaged}: it holds {len(head)} bytes, less than the {HEADER.size}-"
                         f"byte {expected} header")
    _, size, digest = HEADER.unpack(head)
    actual = os.fstat(f.fileno()).st_size - HEADER.size
    if actual != size:
        raise ValueError(f"{damaged}: its header says {size} bytes of data follow, the file "
                         f"holds {actual}")
    sha = hashlib.sha256()
    while chunk := f.read(_CHUNK):
        sha.update(chunk)
    if sha.digest() != digest:
        raise ValueError(f"{damaged}: the SHA-256 checksum of its data (weights, optimizer "
                         f"state, loss-scale state, metadata) is {sha.hexdigest()}, the header "
                         f"says {digest.hex()}")
    f.seek(HEADER.size)


def read(path: str | os.PathLike[str], expected: str) -> dict[str, Any]:
    """The payload of an ``expected`` file (FORMAT or WEIGHTS_FORMAT), its checksum verified."""
    where = os.fspath(path)
    with open(where, "rb") as f:
        start = f.read(len(MAGIC))
        f.seek(0)
        checked = start == MAGIC
        if checked:
            _verify(f, where, expected)
        elif start[:1] != b"\x80":  # not a bare pickle (protocol 2+) of an old mpcore either
            raise ValueError(f"{where!r} is not an {expected} file, or its header is damaged "
                             f"(it starts with {start!r}, not {MAGIC!r})")
        try:
            data = pickle.load(f)
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError) as exc:
            raise ValueError(f"{where!r} is not an {expected} file (it does not "
                             f"unpickle: {exc})") from exc
    if not isinstance(data, dict) or data.get("format") != expected:
        found = data.get("format") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"{where!r} is not an {expected} file (found {found!r})")
    if data.get("version") != VERSION:
        raise ValueError(f"{where!r} has version {data.get('version')!r}; this "
                         f"mpcore reads version {VERSION}")
    missing = [key for key in REQUIRED[expected] if key not in data]
    if missing:
        raise ValueError(f"{where!r} is missing {', '.join(map(repr, sorted(missing)))} of "
                         f"the keys an {expected} file holds ({', '.join(REQUIRED[expected])}); "
                         "it was not written by mpcore.checkpoint")
    names, values = data["names"], data["values"]
    if not isinstance(names, list) or not isinstance(values, list) or len(names) != len(values):
        count = [len(v) if isinstance(v, list) else type(v).__name__ for v in (names, values)]
        raise ValueError(f"{where!r} holds {count[0]} names and {count[1]} values; they must "
                         "be lists that pair up")
    if not checked:
        logger.warning("%r has no checksum (an old %s file): loaded without an integrity "
                       "check; save it again to add one", where, expected)
    return data


def _check_weights(model: Any, names: list[str], values: list[Any], path: str) -> None:
    own = model.weights
    if len(values) != len(own):
        raise ValueError(f"{path!r} holds {len(values)} weights, model {model.name!r} has "
                         f"{len(own)}")
    for var, name, value in zip(own, names, values):
        if tuple(value.shape) != var.shape:
            raise ValueError(f"weight {name!r} in {path!r} has shape {tuple(value.shape)}, "
                             f"model weight {var.name!r} has shape {var.shape}")


def save_weights(model: Any, path: str | os.PathLike[str]) -> None:
    atomic_write(path, {"format": WEIGHTS_FORMAT, "version": VERSION,
                        "names": [v.name for v in model.weights],
                        "values": model.get_weights()})


def load_weights(model: Any, path: str | os.PathLike[str]) -> None:
    data = read(path, WEIGHTS_FORMAT)
    _check_weights(model, data["names"], data["values"], os.fspath(path))
    model.set_weights(data["values"])


def save(path: str | os.PathLike[str], model: Any, optimizer: Any = None,
         **extra: Any) -> None:
    """Write a full checkpoint of ``model`` (and ``optimizer``, by default the model's)."""
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    payload = {
        "format": FORMAT, "version": VERSION,
        "names": [v.name for v in model.weights], "values": model.get_weights(),
        "optimizer": None if opt is None else opt.get_state(model.trainable_variables),
        "random": _random.get_state(),
        "train_step": getattr(model, "_train_steps", 0),
        "extra": extra,
    }
    atomic_write(path, payload)


def restore(path: str | os.PathLike[str], model: Any, optimizer: Any = None) -> dict[str, Any]:
    """Load a checkpoint written by :func:`save` into ``model`` (built, with the same
    architecture) and its optimizer; restores ``mp.random``'s state. Returns ``extra``."""
    data = read(path, FORMAT)
    _check_weights(model, data["names"], data["values"], os.fspath(path))
    opt = optimizer if optimizer is not None else getattr(model, "optimizer", None)
    if data["optimizer"] is not None and opt is None:
        raise ValueError(f"{os.fspath(path)!r} holds optimizer state but the model has no "
                         "optimizer: compile it (or pass optimizer=) before restoring")
    model.set_weights(data["values"])
    if data["optimizer"] is not None:
        opt.set_state(model.trainable_variables, data["optimizer"])
    _random.set_state(data["random"])
    if hasattr(model, "_train_steps"):
        model._train_steps = int(data["train_step"])
    return dict(data["extra"])
