"""The contract of `BackgroundDeleter` that `Kube.delete_job` relies on: a bounded number of
deletions wait, past that the caller deletes (a slow apiserver slows the runs down instead
of piling up finished Jobs), and after a shutdown the deletion happens in the caller's thread."""

from __future__ import annotations

import threading

from fleettune.controller.deleter import BackgroundDeleter
from fleettune.controller.watch import WatchCache

MANAGED = {"app.kubernetes.io/managed-by": "fleettune"}


def test_a_full_deleter_hands_the_deletion_back_and_one_shut_down_deletes_at_once() -> None:
    release = threading.Event()
    deleted: list[str] = []
    callers: list[str] = []

    def delete_now(namespace: str, name: str) -> None:
        if threading.current_thread().name.startswith("fleettune-delete"):
            release.wait(10)  # the apiserver is slow
        else:
            callers.append(name)
        deleted.append(name)

    deleter = BackgroundDeleter(WatchCache(required=MANAGED, resync_s=60), delete_now, threads=1)
    assert deleter.delete("ns", "a") and deleter.delete("ns", "b")  # one deleting, one waiting
    assert not deleter.delete("ns", "c")  # 2 x threads taken: the caller deletes this one itself
    release.set()
    deleter.shutdown(wait=True)
    assert sorted(deleted) == ["a", "b"] and callers == []
    assert deleter.delete("ns", "d")  # taken, and deleted before `delete` returns
    assert callers == ["d"]
