"""The store's maintenance, as steps: verify, prune, repack, gc and the sizes (storage bytes,
stats), over the engine (``Core``) of a store object: what both faces drive."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import timedelta
from typing import Any

from cas_checkpoint.backends import Backend, ObjectInfo
from cas_checkpoint.backends.sealed import unwrap
from cas_checkpoint.engine import archive, retention
from cas_checkpoint.engine.core import Core
from cas_checkpoint.engine.model import StoreStats
from cas_checkpoint.engine.object_store import ObjectStore
from cas_checkpoint.engine.refs import Ref, RefStore
from cas_checkpoint.engine.steps import List, Step
from cas_checkpoint.errors import InvalidArgumentError
from cas_checkpoint.format.heads import PackRef
from cas_checkpoint.format.objects import LogEntry
from cas_checkpoint.maintenance import expire as expiry
from cas_checkpoint.maintenance import gc as gcmod
from cas_checkpoint.maintenance import gc_marks, ref_summary, stats_summary
from cas_checkpoint.maintenance import repack as repackmod
from cas_checkpoint.maintenance import stats as usage
from cas_checkpoint.maintenance.repack import RepackReport
from cas_checkpoint.maintenance.verify import verify as verify_step
from cas_checkpoint.maintenance.verify_report import Progress, VerifyReport

log = logging.getLogger("cas_checkpoint")


class Maintenance:
    """The maintenance steps of the store object whose engine is ``core``."""

    def __init__(self, core: Core) -> None:
        self.core = core
        self.backend: Backend = core.backend
        self.objects: ObjectStore = core.objects
        self.refs: RefStore = core.refs

    # --- audit, retention, garbage collection ---

    def verify(self, *, deep: bool = True, sample: float | None = None,
               thread_id: str | None = None, progress: Progress | None = None
               ) -> Step[VerifyReport]:
        return (yield from verify_step(self.backend, self.refs, deep=deep, sample=sample,
                                       thread_id=thread_id, progress=progress))

    def _targets(self, thread_id: str | None) -> Step[list[str]]:
        if thread_id is None:
            return (yield from self.refs.threads())
        yield from self.core.ref(thread_id)
        return [thread_id]

    def prune(self, thread_id: str | None = None, *, keep_last: int | None = None,
              older_than: timedelta | None = None, keep_labeled: bool = True,
              keep_tags: Iterable[str] = (), dry_run: bool = False
              ) -> Step[retention.PruneReport]:
        retention.check_policy(keep_last, older_than)
        threads = yield from self._targets(thread_id)
        report = yield from retention.prune(self.refs, threads, keep_last=keep_last,
                                        older_than=older_than, keep_labeled=keep_labeled,
                                        dry_run=dry_run, keep_tags=keep_tags)
        for t in report.threads:
            self.core.forget_thread(t, ref_only=True)
        if report.removed:
            log.info("prune %s", report.to_text().replace("\n", "; "))
        return report

    def expire(self, *, idle_for: timedelta, dry_run: bool = False,
               keep_labeled: bool = False, keep_tags: Iterable[str] = (),
               thread_id: str | None = None, only: Callable[[str], bool] | None = None,
               group: Callable[[str], str | None] | None = None
               ) -> Step[expiry.ExpireReport]:
        report = yield from expiry.expire(self.backend, self.refs, idle_for=idle_for,
                                          dry_run=dry_run, keep_labeled=keep_labeled,
                                          keep_tags=keep_tags, thread_id=thread_id, only=only,
                                          group=group)
        for t in report.expired:
            self.core.forget(t)
        log.info("expire %s", report.to_text())
        return report

    def repack(self, thread_id: str | None = None, *, min_garbage: float = 0.25,
               dry_run: bool = False) -> Step[RepackReport]:
        threads = yield from self._targets(thread_id)
        report = yield from repackmod.repack(self.refs, threads, min_garbage=min_garbage,
                                             dry_run=dry_run)
        for t in report.threads:
            if t.repacked:
                self.core.forget_thread(t.thread_id)
        log.info("%s", report.to_text())
        return report

    def gc(self, *, grace: timedelta = timedelta(hours=1), dry_run: bool = False,
           progress: gcmod.GCProgress | None = None, force: bool = False,
           repack: bool = False, min_garbage: float = 0.25, from_marks: bool = False
           ) -> Step[gcmod.GCReport]:
        gcmod.check_grace(self.backend, grace, force)  # every argument, before any change
        if not all(isinstance(a, bool) for a in (repack, dry_run, from_marks)):
            raise InvalidArgumentError(f"repack, dry_run and from_marks must be True or False, "
                                       f"not {repack!r}, {dry_run!r} and {from_marks!r}")
        if from_marks and repack:
            raise InvalidArgumentError(
                "from_marks=True takes the refs from the workers' marks, and repack=True would "
                "read every thread in this process: pass repack=False (the command line's "
                "--from-marks does), and repack on its own schedule")
        repackmod.check(min_garbage)
        marks = (yield from gc_marks.load(self.backend, {"list": 0, "get": 0})
                 ) if from_marks else None
        repacked = (yield from self.repack(min_garbage=min_garbage, dry_run=dry_run)
                    ) if repack else None
        report = yield from gcmod.collect(self.backend, grace=grace, dry_run=dry_run,
                                          progress=progress, force=force, repacked=repacked,
                                          marks=marks)
        report.repack = repacked
        if not dry_run:
            self.objects.forget(report.deleted)
        log.info("%s", report.to_text())
        return report

    def gc_mark(self, *, shard: int, of: int) -> Step[gc_marks.MarkReport]:
        report = yield from gc_marks.mark(self.backend, shard, of)
        log.info("%s", report.to_text())
        return report

    # --- sizes ---

    def storage_bytes(self) -> Step[int]:
        packs: list[ObjectInfo] = yield List("packs")
        refs: list[ObjectInfo] = yield List("refs")
        return sum(i.size for i in packs) + sum(i.size for i in refs)

    def stats(self, by_thread: bool = False) -> Step[StoreStats]:
        if not isinstance(by_thread, bool):
            raise InvalidArgumentError(f"by_thread must be True or False, not {by_thread!r}")
        if not by_thread and unwrap(self.backend) is self.backend:  # (encrypted: no summary)
            racy = 0.0 if self.backend.ref_version_listed else ref_summary.RACY
            count, known, _read = yield from stats_summary.figures(self.refs, racy, time.time())
            objects_: list[ObjectInfo] = yield List("packs")
            refs_: list[ObjectInfo] = yield List("refs")
            physical_ = sum(i.size for i in objects_) + sum(i.size for i in refs_)
            logical_ = sum(known.values())
            return StoreStats(count, len(known), logical_, physical_, len(objects_),
                              logical_ / physical_ if physical_ else 0.0, self.objects.hits,
                              self.objects.misses, {})
        sizes: dict[str, int] = {}
        logs: dict[str, list[LogEntry]] = {}
        threads = yield from self.core.all_refs()
        for thread, ref in threads:
            if ref is not None:
                logs[thread] = yield from self.refs.entries(ref.head)
                sizes.update((e.id, e.size) for e in logs[thread])
        objects: list[ObjectInfo] = yield List("packs")
        refs: list[ObjectInfo] = yield List("refs")
        physical = sum(i.size for i in objects) + sum(i.size for i in refs)
        logical = sum(sizes.values())

        def head_state(thread: str, ref: Ref) -> Step[Any]:
            return (yield from self.core.load_ref(thread, ref, None)).state

        named: dict[str, tuple[PackRef, ...]] = {}
        if by_thread:  # a long thread names packs through its archive too (archive.py)
            for thread, ref in threads:
                if ref is not None:
                    named[thread] = yield from archive.named(self.objects, ref.head)
        per = (yield from usage.by_thread(threads, logs, objects, refs, head_state, named)
               ) if by_thread else {}
        return StoreStats(len(threads), len(sizes), logical, physical, len(objects),
                          logical / physical if physical else 0.0, self.objects.hits,
                          self.objects.misses, per)

