"""A board folder: where its runs are kept, and how its files are written.

A folder (``leaderboard/`` by default) keeps its runs twice: ``results.sqlite``, the working store runs write to
as they go (ignored by git), and ``runs.jsonl``, the text export committed beside the board. The rules:

- **Joined first.** Every command that opens a folder first joins the two: a run only one of them holds counts,
  and a run both hold with different content is resolved by which side changed since they last agreed (the
  database records each run's digest as the export last held it): changed here (a run resumed or retried since)
  keeps the database's copy, changed there (a ``git pull``) takes the export's, changed on both sides is an
  error naming the run and both files, and nothing is changed.
- **Kept runs only grow.** Only commands that add runs (``zoo run``, ``run-all``, ``merge``) write ``runs.jsonl``,
  and it then holds every run of the join. Which runs the *board shows* is the renderer's business; ``zoo prune``
  is the one command that removes runs, and it lists them.
- **Written as a whole.** Every file of one publication (the board's files, the export) is staged under
  ``.zoo-cache/``, then a journal naming them is written atomically, then they are renamed into place; one lock
  serialises publications. An interrupted publication is finished (journal written) or discarded (not yet) by
  the next command that opens the folder, so the board's files are always all from one publication.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterable, Iterator

from .contract import ZooError
from .export import EXPORT, ExportError, RunRecords, check_records, export_bytes, read_export
from .store import DATABASE, SQLITE_HEADER, Store, StoreError, disk_full

SCRATCH = ".zoo-cache"  # ignored by git: the lock, staged files, the journal, executors' temporary files
LOCK, JOURNAL, STAGING = "lock", "publish.json", "publish-"


class FolderError(ZooError):
    """A board folder cannot be read or written (not writable, disk full, runs that conflict)."""


class BoardFolder:
    """The folder at ``path`` (see the module's rules)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        self.database = self.path / DATABASE
        self.export = self.path / EXPORT
        self.scratch = self.path / SCRATCH
        self.unexported: list[str] = []  # after a join: the runs the database holds and the export does not

    # --- opening ----------------------------------------------------------------------------------------

    def exists(self) -> bool:
        return self.database.exists() or self.export.exists()

    def for_writing(self) -> Store:
        """The folder's database, joined with its export: what a run, a merge or a prune works on."""
        self.path_must_be_writable()
        with self._locked():
            exported = self._read_export()  # a bad export is refused before a database is created or changed
            store = Store(self.database)
            store.check()
            self._join(store, exported)
        return store

    def for_reading(self) -> Store:
        """The join of the database and the export as an in-memory store: neither file is written."""
        if not self.exists():
            raise FolderError(f"--out: no results database at {str(self.database)!r} nor its export {EXPORT}; "
                              "run `zoo run-all` first")
        if self._writable():
            with self._locked():  # finish an interrupted publication, so what is read is one of them
                pass
        exported = self._read_export()
        store = Store(self.database, readonly=True).copy_to_memory() if self.database.exists() else \
            Store.in_memory(f"{self.export} (read into memory)")
        self._join(store, exported)
        return store

    def _read_export(self) -> dict[str, RunRecords]:
        return read_export(self.export) if self.export.exists() else {}

    def _join(self, store: Store, exported: dict[str, RunRecords]) -> None:
        self.unexported = sorted(set(store.runs().run_id) - set(exported))
        mine, agreed = store.records(exported), store.exported()
        adding, replacing, digests, conflicts = [], [], {}, []
        for run_id, theirs in exported.items():
            theirs_digest, ours = theirs.digest(), mine.get(run_id)
            if ours is None:
                adding.append(theirs)
                digests[run_id] = theirs_digest
                continue
            ours_digest = ours.digest()
            if ours_digest == theirs_digest:
                if agreed.get(run_id) != theirs_digest:
                    digests[run_id] = theirs_digest
            elif agreed.get(run_id) == theirs_digest:
                continue  # changed here since the export was written: the next run or merge exports it
            elif agreed.get(run_id) == ours_digest:
                replacing.append(theirs)  # changed in the export (a pull) since this database last saw it
                digests[run_id] = theirs_digest
            else:
                conflicts.append(f"run {run_id!r} ({store.label}: {ours.describe()}; {self.export}: {theirs.describe()})")
        if conflicts:
            raise FolderError(
                f"{len(conflicts)} run(s) differ between {store.label!r} and {str(self.export)!r} and both changed "
                f"since they last agreed: {'; '.join(conflicts[:3])}; nothing was changed. Keep the copy you want: "
                f"move {DATABASE} aside to use {EXPORT}'s, or restore {EXPORT} (git checkout) to keep the database's")
        if adding or replacing or digests:
            store.add([*replacing, *adding], replacing=[r.run_id for r in replacing], exported=digests, only_new=True)

    # --- writing ----------------------------------------------------------------------------------------

    def publish(self, files: dict[str, bytes], store: Store | None = None, remove: Iterable[str] = ()) -> list[Path]:
        """Write ``files`` (name -> content) into the folder as a whole and delete ``remove``; with ``store`` (the
        folder's own database), also the export of every run it holds, joined first with the export on disk
        now (a pull during a run is kept). Returns the paths written."""
        self.path_must_be_writable()
        with self._locked():
            files = dict(files)
            if store is not None:
                self._join(store, self._read_export())
                runs = store.records()
                files[EXPORT] = export_bytes(runs.values())
            written = self._commit(files, [name for name in remove if name not in files])
            if store is not None:
                store.set_exported({run_id: run.digest() for run_id, run in runs.items()})
        return written

    def _commit(self, files: dict[str, bytes], remove: list[str]) -> list[Path]:
        staging = self.scratch / f"{STAGING}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        journal = self.scratch / JOURNAL
        try:
            staging.mkdir(parents=True)
            for name, content in files.items():
                _write_durably(staging / name, content)
            _write_durably(journal.with_name(f"{JOURNAL}.{staging.name}"),
                           json.dumps({"staging": staging.name, "files": sorted(files), "remove": remove}).encode())
            os.replace(journal.with_name(f"{JOURNAL}.{staging.name}"), journal)  # the commit point
        except OSError as exc:
            journal.with_name(f"{JOURNAL}.{staging.name}").unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
            raise self._write_failure(exc, "the board was not written; the previous one is as it was") from None
        self._apply(journal)
        return [self.path / name for name in files]

    def _apply(self, journal: Path) -> None:
        """Carry out a written journal (again, after an interruption: each step can be repeated)."""
        plan = json.loads(journal.read_text())
        staging = self.scratch / plan["staging"]
        for name in plan["files"]:
            if (staging / name).exists():
                os.replace(staging / name, self.path / name)
        for name in plan["remove"]:
            (self.path / name).unlink(missing_ok=True)
        journal.unlink()
        shutil.rmtree(staging, ignore_errors=True)

    def _recover(self) -> None:
        """With the lock held: finish a publication whose journal was written, and drop staged files of ones
        that never got that far (their writers are gone: a writer holds the lock while it publishes)."""
        journal = self.scratch / JOURNAL
        if journal.exists():
            self._apply(journal)
        for leftover in [*self.scratch.glob(f"{STAGING}*"), *self.scratch.glob(f"{JOURNAL}.*")]:
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        """The folder's lock (blocking), with any interrupted publication recovered first."""
        try:
            self.scratch.mkdir(parents=True, exist_ok=True)
            handle = open(self.scratch / LOCK, "a")
        except OSError as exc:
            raise self._write_failure(exc, "nothing was written") from None
        with handle:
            fcntl.flock(handle, fcntl.LOCK_EX)
            try:
                self._recover()
                yield
            finally:
                fcntl.flock(handle, fcntl.LOCK_UN)

    def _writable(self) -> bool:
        return os.access(self.path, os.W_OK)

    def path_must_be_writable(self) -> None:
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise self._write_failure(exc, "nothing was written") from None
        if not self._writable():
            raise FolderError(f"--out: cannot write to {str(self.path)!r} (not writable)")

    def _write_failure(self, exc: OSError, consequence: str) -> FolderError:
        if exc.errno == errno.ENOSPC:
            return FolderError(f"{disk_full(self.path)}: {consequence}")
        return FolderError(f"--out: cannot write to {str(self.path)!r} ({exc.strerror or exc}): {consequence}")

    # --- runs from elsewhere, and pruning ----------------------------------------------------------------

    def merge(self, source: str | os.PathLike) -> tuple[list[str], int]:
        """Add the runs of another machine's database or export that this folder lacks, and export them; a run
        both hold with different content is an error naming it, and nothing is added. Returns (the ids added,
        how many were already here)."""
        theirs = read_runs(Path(source))
        store = self.for_writing()
        ours = store.records(theirs)
        differing = [run_id for run_id, run in theirs.items() if run_id in ours and ours[run_id].digest() != run.digest()]
        if differing:
            raise FolderError(f"run(s) {', '.join(map(repr, differing[:3]))} of {str(source)!r} differ from the copies "
                              f"in {str(self.path)!r} ({theirs[differing[0]].describe()} there, "
                              f"{ours[differing[0]].describe()} here): nothing was merged")
        added = store.add([run for run_id, run in theirs.items() if run_id not in ours], only_new=True)
        self.publish({}, store=store)
        return added, len(theirs) - len(added)

    def prune(self, keep: set[str], dry_run: bool = False) -> list[RunRecords]:
        """Remove every run not in ``keep`` from the database and the export (the one command that shrinks
        them); returns the runs removed (or that would be, with ``dry_run``)."""
        store = self.for_reading() if dry_run else self.for_writing()
        doomed = [run for run_id, run in sorted(store.records().items()) if run_id not in keep]
        if doomed and not dry_run:
            store.remove(run.run_id for run in doomed)
            with self._locked():
                runs = store.records()
                self._commit({EXPORT: export_bytes(runs.values())}, [])
        return doomed


def read_runs(source: Path) -> dict[str, RunRecords]:
    """The runs of a results database or an export file, each checked against the one schema."""
    if not source.is_file():
        raise FolderError(f"DATABASE: no such file {str(source)!r}")
    with open(source, "rb") as handle:
        is_database = handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    if not is_database:
        if source.suffix == ".jsonl":
            return read_export(source)
        Store(source, readonly=True).check()  # says what it is instead
    records = Store(source, readonly=True).records()
    try:
        return check_records((f"{source} ({table} of run {run.run_id!r})", {"table": table, **record})
                             for run in records.values()
                             for table, rows in (("runs", [run.run]), ("jobs", run.jobs), ("results", run.results))
                             for record in rows)
    except ExportError as exc:
        raise StoreError(str(exc)) from None


def _write_durably(path: Path, content: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())

