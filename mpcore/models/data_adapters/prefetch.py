"""Prefetching: the next batches of a generator or a PyDataset are made on worker threads
while the step runs, so data loading does not stall training (Keras 3 uses tf.data's prefetch
or its OrderedEnqueuer for this).

- :class:`Prefetcher`: one background thread pulls items from an iterator into a queue of
  ``depth`` items (the generator's code runs there, one item at a time, in order).
- :class:`OrderedPool`: ``workers`` threads call ``fetch(i)`` for the indices in order, at
  most ``depth`` calls ahead of the consumer, and the consumer gets the results in index
  order (Keras' OrderedEnqueuer with threads).

Nothing waits without end: the consumer polls with a short timeout, so Ctrl-C interrupts it,
and a dead worker ends the wait; a worker waits on a full queue the same way and stops when
told. A worker's exception is raised in the consumer, the original object with its traceback.
Worker threads run in a copy of the caller's context (contextvars: the policy, the backend).
``close`` joins within a deadline; a worker stuck in user code (a blocking read) cannot be
interrupted from Python, so it is a daemon thread and ``close`` warns instead of hanging.
"""

from __future__ import annotations

import collections
import contextvars
import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any

#: How often a wait wakes up to look whether it should stop (seconds).
POLL_S = 0.05
#: How long ``close`` waits for a worker to finish its current item (seconds).
CLOSE_TIMEOUT_S = 5.0

_ITEM, _END, _ERROR = "item", "end", "error"


class Prefetcher:
    """Iterates ``source`` on a background thread, up to ``depth`` items ahead (plus the one
    the worker holds)."""

    def __init__(self, source: Iterator[Any], depth: int, name: str) -> None:
        self._source = source
        self._queue: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=max(1, depth))
        self._stop = threading.Event()
        self._done = False
        context = contextvars.copy_context()
        self._thread = threading.Thread(target=context.run, args=(self._run,),
                                        name=f"mpcore-prefetch-{name}", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            for item in self._source:
                if not self._put((_ITEM, item)):
                    return
            self._put((_END, None))
        except BaseException as error:  # handed to the consumer, raised there
            self._put((_ERROR, error))

    def _put(self, message: tuple[str, Any]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(message, timeout=POLL_S)
                return True
            except queue.Full:
                continue
        return False

    def __iter__(self) -> Prefetcher:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        while True:
            try:
                kind, item = self._queue.get(timeout=POLL_S)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    self._done = True
                    raise RuntimeError("the prefetch worker ended without a result or an "
                                       "error") from None
        if kind == _ITEM:
            return item
        self._done = True
        if kind == _ERROR:
            raise item
        raise StopIteration

    def close(self) -> None:
        """Stop the worker (it finishes the item it is making) and join it."""
        self._stop.set()
        self._done = True
        while True:  # free a worker blocked on a full queue at once
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        _join(self._thread)


def _join(thread: threading.Thread) -> None:
    thread.join(CLOSE_TIMEOUT_S)
    if thread.is_alive():
        warnings.warn(f"{thread.name} is still in the data's own code after "
                      f"{CLOSE_TIMEOUT_S:g}s; it is left to finish in the background",
                      RuntimeWarning, stacklevel=3)


class OrderedPool:
    """``fetch(i)`` for each ``i`` of ``indices`` on ``workers`` threads, at most ``depth``
    ahead of the consumer, results in the order of ``indices``."""

    def __init__(self, fetch: Callable[[int], Any], indices: Iterable[int], workers: int,
                 depth: int, name: str) -> None:
        self._fetch = fetch
        self._indices = iter(indices)
        self._depth = max(1, depth)
        self._pool = ThreadPoolExecutor(max_workers=workers,
                                        thread_name_prefix=f"mpcore-prefetch-{name}")
        self._pending: collections.deque[Future[Any]] = collections.deque()
        self._context = contextvars.copy_context()
        self._fill()

    def _fill(self) -> None:
        while len(self._pending) < self._depth:
            index = next(self._indices, None)
            if index is None:
                return
            # each call in its own copy of the caller's context (a Context runs one at a time)
            self._pending.append(self._pool.submit(self._context.copy().run, self._fetch,
                                                   index))

    def __iter__(self) -> OrderedPool:
        return self

    def __next__(self) -> Any:
        if not self._pending:
            raise StopIteration
        future = self._pending[0]
        while True:
            try:
                result = future.result(timeout=POLL_S)  # its exception, with its traceback
                break
            except FutureTimeout:
                continue
        self._pending.popleft()
        self._fill()
        return result

    def close(self) -> None:
        """Cancel the calls not started and wait (within a deadline) for the running ones."""
        for future in self._pending:
            future.cancel()
        self._pending.clear()
        self._pool.shutdown(wait=False, cancel_futures=True)
        for thread in list(getattr(self._pool, "_threads", ())):
            _join(thread)
