"""Deleting finished trial Jobs off the tuning steps' threads.

A run reacts to a finished trial without waiting for the apiserver to delete the trials
before it: the Job leaves the watch-fed cache at once, and the deletion itself happens in
one of a few background threads.

Contract of `BackgroundDeleter`:

* `BackgroundDeleter.delete` returns True when it took the deletion: the Job is already out
  of ``cache`` (a run's next list no longer shows it) and ``delete_now(namespace, name)``
  runs in one of ``threads`` background threads. It returns False, taking nothing, when
  ``2 * threads`` deletions are already waiting: the caller then deletes in its own thread,
  so that a slow apiserver slows the runs down instead of piling up finished Jobs.
* A background deletion that raises is logged, and the Job is put back on the cache's next
  list (`WatchCache.undelete`): its run finds it there and deletes it again.
* After `shutdown`, a deletion is made in the caller's thread (still taken: True).
* ``delete_now`` must treat a Job already gone as deleted.

"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from fleettune.controller.watch import WatchCache

log = logging.getLogger(__name__)


class BackgroundDeleter:
    """A few threads deleting Jobs for the tuning loop (the module's docstring has the contract)."""

    def __init__(self, cache: WatchCache, delete_now: Callable[[str, str], None], threads: int = 8) -> None:
        self.cache = cache
        self._delete_now = delete_now
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="fleettune-delete")
        self._waiting = threading.BoundedSemaphore(2 * threads)

    def delete(self, namespace: str, name: str) -> bool:
        """Hand over the deletion of Job ``namespace/name``; False when the caller must delete it."""
        if not self._waiting.acquire(blocking=False):
            return False
        uid = self.cache.deleted(namespace, name)
        try:
            self._pool.submit(self._delete, namespace, name, uid)
        except RuntimeError:  # shut down: delete here
            self._waiting.release()
            self._delete_now(namespace, name)
        return True

    def shutdown(self, wait: bool = True) -> None:
        """Take no more deletions into the background; with ``wait``, until those taken are done."""
        self._pool.shutdown(wait=wait)

    def _delete(self, namespace: str, name: str, uid: str | None) -> None:
        try:
            self._delete_now(namespace, name)
        except Exception as exc:  # the next list shows the Job again, and its run deletes it again
            log.warning("deleting Job %s/%s failed, will retry: %s", namespace, name, str(exc)[:200])
            self.cache.undelete(namespace, uid)
        finally:
            self._waiting.release()
