"""A board folder: where its runs are kept, and how its files are written.

A folder (``leaderboard/`` by default) keeps its runs twice: ``results.sqlite``, the working store runs write to
as they go (ignored by git), and ``runs.jsonl``, the text export committed beside the board. The rules:

- **Joined first.** Every command that opens a folder first joins the two, both checked against the one schema:
  a run only one of them holds counts. A run both hold with different content is the database's when only the
  database changed it since they last agreed (a run resumed or retried here; the database records each run's
  digest as the export last held it); any other difference (the export's copy changed since: an older file
  checked out, a hand edit, a bad merge) is an error naming the run and both files, and nothing is changed. A
  join never replaces or shrinks a run. It is skipped where the database records that it agreed, run for run,
  with the very bytes the export holds now and nothing was written to it since (it counts every write:
  ``Store.agree``): joining those would change nothing and have nothing to say.
- **Kept runs only grow.** Only commands that add runs (``zoo run``, ``run-all``, ``merge``) write ``runs.jsonl``,
  and it then holds every run of the join (a run with no job yet carries nothing and is left out). Which runs
  the *board shows* is the renderer's business; ``zoo prune`` is the one command that removes runs, and it
  names each.
- **Written as a whole.** Every file of one publication (the board's files, the export) is staged under
  ``.zoo-cache/``, then a journal naming them and what each file held before is written atomically, then they
  are renamed into place, each step on disk (files and folders synced) before the next; one lock serialises
  publications. An interrupted publication is finished (journal written) or discarded (not yet) by the next
  command that opens the folder, so the board's files are all from one publication; a file changed by someone
  else since the journal was written (a ``git pull``) is left as it is, and its staged copy dropped (the
  database still holds every run that copy had).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import shutil
import uuid
from pathlib import Path
from typing import Iterable, Iterator

from .contract import OptionError, ZooError
from .export import (DATABASE, EXPORT, ExportError, RunRecords, check_records, export_file_bytes,
                     export_with_spans, parse_export, read_export)
from .store import SQLITE_HEADER, Store, StoreError, disk_full

SCRATCH = ".zoo-cache"  # ignored by git: the lock, staged files, the journal, executors' temporary files
LOCK, JOURNAL, STAGING = "lock", "publish.json", "publish-"
KEPT = (DATABASE, EXPORT)  # never removed by a publication
_JOINED: dict[tuple[Path, Path], tuple[str | None, frozenset[str]]] = {}
"""(export, database) -> the sha256 of the export (None: none) as this process last joined it with that database or
wrote it from it, and the runs the database then held. A publication that finds those bytes there and every one of
those runs still in the database has nothing to join: it neither reads nor checks a board's runs again (each pass
over a board of 180,000 rows cost seconds). A run gone from the database meanwhile (pruned by another process, the
export then restored) is joined back from the export, as any other process would."""


class FolderError(ZooError):
    """A board folder cannot be read or written (not writable, disk full, runs that conflict)."""


class RunsChanged(FolderError):
    """The folder's runs were published anew (by a run, a merge or a prune) after a board of them was read and
    before it was published: publishing it would put an older board over the newer one."""


class BoardFolder:
    """The folder at ``path`` (see the module's rules)."""

    def __init__(self, path: str | os.PathLike) -> None:
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise FolderError(f"--out: expected a folder, got {path!r}")
        self.path = Path(path)
        self.database = self.path / DATABASE
        self.export = self.path / EXPORT
        self.scratch = self.path / SCRATCH
        self.unexported: list[str] = []  # after a join: the runs with jobs the database holds and the export does not
        self.changed_here: list[str] = []  # after a join: runs the database changed since the export last held them
        self.read_export: tuple[str | None] | None = None  # after for_reading: (the sha256 of the export it read,)

    # --- opening ----------------------------------------------------------------------------------------

    def exists(self) -> bool:
        """Whether the folder holds a database or an export."""
        return self.database.exists() or self.export.exists() or self.export.is_symlink()

    def for_writing(self) -> Store:
        """The folder's database, joined with its export: what a run, a merge or a prune works on."""
        self.path_must_be_writable()
        with self._locked():
            return self._joined_store()

    def _joined_store(self) -> Store:
        """With the lock held: the database, checked, joined with the export."""
        data = self._export_bytes()
        sha = _sha256(data)
        if self.database.exists() and self._agreed(Store(self.database, readonly=True), sha):
            store = Store(self.database)
        else:
            kept = self._parse(data)  # a bad export is refused before a database is created or changed
            store = Store(self.database)
            store.check()
            self._join(store, kept, sha)
        self._remember(store, sha)
        return store

    def for_reading(self) -> Store:
        """The join of the database and the export as an in-memory store: neither file is written."""
        if not self.exists():
            raise FolderError(f"--out: no results database at {str(self.database)!r} nor its export {EXPORT}; "
                              "run `zoo run-all` first")
        data, store = self._as_one_publication(lambda: (  # a run published between the two: a false conflict
            self._export_bytes(), Store(self.database, readonly=True).copy_to_memory() if self.database.exists()
            else Store.in_memory(f"{self.export} (read into memory)")))
        sha = _sha256(data)
        if not self._agreed(store, sha):
            self._join(store, self._parse(data), sha)
        self.read_export = (sha,)
        return store

    def published(self, pattern: str) -> dict[str, bytes]:
        """The board's files now published here whose names match ``pattern`` (name -> bytes), read as one
        publication: under the folder's lock where it can be taken, so a publication in progress is never read
        half-way (a file it removes, gone between listing and reading)."""
        def read() -> dict[str, bytes]:
            found = {}
            for path in sorted(self.path.glob(pattern)):
                try:
                    found[path.name] = path.read_bytes()
                except FileNotFoundError:  # removed since listed: only where there is no lock to wait for
                    continue
            return found

        return self._as_one_publication(read)

    def _as_one_publication(self, read):
        """``read()`` under the folder's lock, after any interrupted publication is finished, where the lock can be
        taken (a read-only folder, or a read-only scratch folder, has no writer to wait for): what it reads is all
        one publication's."""
        if self._writable() and (not self.scratch.exists() or os.access(self.scratch, os.W_OK)):
            with self._locked():
                return read()
        return read()  # no lock to take: and with nowhere to stage a publication, none can be under way

    def _export_bytes(self) -> bytes | None:
        """The export's bytes (None: there is none); one that is a link or cannot be read is refused."""
        if self.export.is_symlink():
            raise FolderError(f"{self.export}: a symbolic link; the zoo rewrites {EXPORT} in place, so keep the "
                              "file itself there")
        return export_file_bytes(self.export) if self.export.exists() else None

    def _parse(self, data: bytes | None) -> dict[str, RunRecords]:
        return {} if data is None else parse_export(data, self.export)

    def _key(self, store: Store) -> tuple[Path, Path]:
        return self.export.resolve(), store.path.resolve()

    def _remember(self, store: Store, sha: str | None) -> None:
        """The export (its sha256; None: there is none) is now what ``store`` was joined with (or wrote)."""
        _JOINED[self._key(store)] = sha, frozenset(store.runs().run_id)

    def _joined_already(self, store: Store, sha: str | None) -> bool:
        """Whether this process last joined ``store`` with the export of this sha256 (or wrote it from it), and
        ``store`` still holds every run it held then."""
        joined, runs = _JOINED.get(self._key(store), (False, frozenset()))
        return joined == sha and runs <= set(store.runs().run_id)

    def _agreed(self, store: Store, sha: str | None) -> bool:
        """Whether ``store`` agreed run for run with the export of this sha256 and nothing was written to it since
        (then there is nothing to join and nothing to say)."""
        if sha is None or store.agreed_export() != sha:
            return False
        self.unexported, self.changed_here = [], []
        return True

    def _join(self, store: Store, exported: dict[str, RunRecords], sha: str | None) -> None:
        """Join the export's runs (``exported``, parsed from the export of this sha256) into ``store`` (see the
        module's rules); where they then hold the same runs and there is nothing to say, a file store records that
        it agrees with that export."""
        generation = store.generation()  # before reading it: a write from elsewhere meanwhile voids the agreement
        mine = checked(store)
        agreed = store.exported()
        missing = set(mine) - set(exported)
        self.unexported = sorted(run for run in missing if mine[run].jobs)  # a run with no job is never exported
        adding, digests, conflicts, changed, spans = [], {}, [], [], {}
        for run_id, theirs in exported.items():
            ours = mine.get(run_id)
            if ours is None:
                if theirs.jobs:  # a run exported before any job finished carries nothing
                    adding.append(theirs)
                    if not store.in_memory_only:  # a copy in memory outlives no command: it records none
                        digests[run_id] = theirs.digest()
                        spans.update(_span(theirs, digests[run_id]))
                continue
            ours_digest, theirs_digest = ours.digest(), theirs.digest()
            if ours_digest == theirs_digest:
                if agreed.get(run_id) != theirs_digest:
                    digests[run_id] = theirs_digest
                spans.update(_span(theirs, theirs_digest))
            elif agreed.get(run_id) != theirs_digest:  # the export's copy is not the one this database last wrote
                conflicts.append(f"run {run_id!r} ({store.label}: {ours.describe()}; {self.export}: {theirs.describe()})")
            else:  # changed here since (resumed or retried): the database's copy, said so (:meth:`notices`)
                changed.append(f"{run_id} ({theirs.describe()} exported, {ours.describe()} here)")
        if conflicts:
            raise FolderError(
                f"{len(conflicts)} run(s) differ between {store.label!r} and {str(self.export)!r}, and the export's "
                f"copy is not the one this database last wrote: {'; '.join(conflicts[:3])}; nothing was changed. "
                f"Keep the copy you want: move {DATABASE} aside to use {EXPORT}'s, or restore {EXPORT} (git "
                "checkout) to the one it wrote")
        self.changed_here = sorted(changed)
        agree = None if (sha is None or store.in_memory_only or missing or self.changed_here
                         or generation is None) else (sha, generation)
        spans = None if store.in_memory_only else spans
        if adding or digests:
            store.add(adding, exported=digests, only_new=True, agree=agree, spans=spans)
        elif agree is not None:
            store.agree(*agree, spans=spans)

    def notices(self, writing: bool) -> list[str]:
        """What the last join decided that its command should say (none of it silently): the database's runs the
        export lacks (a command that only reads shows them; a writing one exports them), and the runs changed here
        since the export last held them, whose database copy wins."""
        def listed(runs: list[str]) -> str:
            return "; ".join(runs[:3]) + ("; ..." if len(runs) > 3 else "")

        lines = []
        if self.unexported and not writing:
            lines.append(f"zoo: warning: {len(self.unexported)} run(s) in {DATABASE} are not in {EXPORT} yet "
                         f"({listed(self.unexported)}); the next `zoo run` or `zoo merge` into {self.path} adds them")
        if self.changed_here:
            then = f"{EXPORT} now takes this database's copy" if writing else \
                f"the board shows this database's copy; the next `zoo run` or `zoo merge` into {self.path} exports it"
            lines.append(f"zoo: note: {len(self.changed_here)} run(s) changed in {DATABASE} since {EXPORT} last held "
                         f"them (resumed or retried here: {listed(self.changed_here)}); {then}")
        return lines

    # --- writing ----------------------------------------------------------------------------------------

    def publish(self, files: dict[str, bytes], store: Store | None = None, remove: Iterable[str] = (),
                as_read: bool = False) -> list[Path]:
        """Write ``files`` (name -> content) into the folder as a whole and delete ``remove``; with ``store`` (the
        folder's own database), also the export of every run it holds, joined first with the export on disk
        now (a pull during a run is kept); ``as_read``: only while the export is the one :meth:`for_reading`
        read, else :class:`RunsChanged` and nothing is written. Returns the paths written."""
        self.path_must_be_writable()
        with self._locked():
            if as_read and self.read_export != (_sha256(self._export_bytes()),):
                raise RunsChanged(f"--out: the runs in {str(self.path)!r} were published anew while its board was "
                                  "drawn; that board was not written")
            if store is None:
                return self._commit(dict(files), [name for name in remove if name not in files])
            data = self._export_bytes()
            sha = _sha256(data)
            if not self._joined_already(store, sha) and not self._agreed(store, sha):
                self._join(store, self._parse(data), sha)
            return self._export(store, files, remove, data)

    def _export(self, store: Store, files: dict[str, bytes] | None = None, remove: Iterable[str] = (),
                on_disk: bytes | None = None) -> list[Path]:
        """With the lock held: ``files`` and the export of every run ``store`` (the folder's database) holds,
        published as a whole; each run's digest recorded as the export holds it, and, where the export on disk is
        now those very bytes and nothing else wrote to the database meanwhile, that the two agree. A run not written
        to since an export was written from ``store`` is copied from that export's bytes where ``on_disk`` (the
        export's bytes now) still holds them (:meth:`zoo.store.Store.exported_spans`): serialising every run of a
        board's folder took seconds."""
        generation = store.generation()  # before reading the runs: a write after it voids the agreement
        kept = _kept_runs(store.exported_spans(), on_disk)
        run_ids = list(store.runs().run_id)
        runs = store.records([run_id for run_id in run_ids if run_id not in kept])
        files = dict(files or {})
        files[EXPORT], digests, spans = export_with_spans(runs.values(), {run_id: kept[run_id] for run_id in run_ids
                                                                           if run_id in kept})
        written = self._commit(files, [name for name in remove if name not in files])
        sha = _sha256(files[EXPORT])
        agrees = (generation is not None and len(digests) == len(run_ids)  # a run with no job yet is not exported
                  and _digest(self.export) == sha)  # else changed by someone else since the journal: left as it is
        store.set_exported(digests, agree=(sha, generation) if agrees else None, spans=spans)
        self._remember(store, sha)
        return written

    def _commit(self, files: dict[str, bytes], remove: list[str]) -> list[Path]:
        for name in [*files, *remove]:
            if not _plain_name(name) or (name in remove and name in KEPT):
                raise FolderError(f"a board file must be a plain file name in {self.path}, got {name!r}")
        staging = self.scratch / f"{STAGING}{os.getpid()}-{uuid.uuid4().hex[:8]}"
        journal = self.scratch / JOURNAL
        pending = journal.with_name(f"{JOURNAL}.{staging.name}")
        try:
            staging.mkdir(parents=True)
            for name, content in files.items():
                _write_durably(staging / name, content)
            _sync_folder(staging)
            before = {name: _digest(self.path / name) for name in [*files, *remove]}
            _write_durably(pending, json.dumps({"staging": staging.name, "files": sorted(files), "remove": remove,
                                                "before": before}).encode())
            _sync_folder(self.scratch)  # the staging folder's entry on disk before a journal can name it
            os.replace(pending, journal)  # the commit point
        except OSError as exc:
            pending.unlink(missing_ok=True)
            shutil.rmtree(staging, ignore_errors=True)
            raise self._write_failure(exc, "the board was not written; the previous one is as it was") from None
        try:
            _sync_folder(self.scratch)  # the journal on disk before any file is put in place
        except OSError as exc:
            raise self._unfinished("write the journal to disk", exc) from None
        self._apply(journal)
        return [self.path / name for name in files]

    def _apply(self, journal: Path) -> None:
        """Carry out a written journal (again, after an interruption: each step can be repeated). A file whose
        content is neither what it held when the journal was written nor the staged one was changed since by
        someone else, and is left as it is; a journal that is not one of the zoo's is dropped."""
        plan = _journal(journal)
        if plan is not None:
            staging = self.scratch / plan["staging"]
            for name in plan["files"]:
                staged, target = staging / name, self.path / name
                if staged.is_file() and _digest(target) == plan["before"].get(name):
                    try:
                        _move_into_place(staged, target)
                    except OSError as exc:  # the journal stays: the next command that can finishes the publication
                        raise self._unfinished(f"put {name} in place", exc) from None
            for name in plan["remove"]:
                if _digest(self.path / name) == plan["before"].get(name):
                    try:
                        (self.path / name).unlink(missing_ok=True)
                    except OSError as exc:
                        raise self._unfinished(f"remove {name}", exc) from None
            try:
                _sync_folder(self.path)  # the renames on disk before the journal that can finish them goes
            except OSError as exc:
                raise self._unfinished("write the folder's new entries to disk", exc) from None
            shutil.rmtree(staging, ignore_errors=True)
        journal.unlink(missing_ok=True)

    def _unfinished(self, step: str, exc: OSError) -> FolderError:
        """A publication past its commit point that cannot take ``step``: what and why, in one line."""
        return FolderError(f"--out: cannot {step} in {str(self.path)!r} ({exc.strerror or exc}); the publication "
                           f"is kept in {SCRATCH}, and the next command on the folder that can finishes it")

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
            if exc.errno == errno.ENOSPC or not self.path.is_dir():
                raise self._write_failure(exc, "nothing was written") from None
            culprit = str(exc.filename or self.scratch / LOCK)
            raise FolderError(f"--out: cannot write {culprit!r} ({exc.strerror or exc}): a publication takes the "
                              f"lock {SCRATCH}/{LOCK} and stages its files in {SCRATCH}; nothing was written") from None
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
        """Make the folder, or refuse in one line why it cannot be written."""
        if self.path.exists() and not self.path.is_dir():
            raise FolderError(f"--out: {str(self.path)!r} is a file, not a folder")
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
        self.path_must_be_writable()
        with self._locked():
            store = self._joined_store()
            ours = store.records(theirs)
            differing = [run_id for run_id, run in theirs.items()
                         if run_id in ours and ours[run_id].digest() != run.digest()]
            if differing:
                raise FolderError(f"run(s) {', '.join(map(repr, differing[:3]))} of {str(source)!r} differ from the "
                                  f"copies in {str(self.path)!r} ({theirs[differing[0]].describe()} there, "
                                  f"{ours[differing[0]].describe()} here): nothing was merged")
            added = store.add([run for run_id, run in theirs.items() if run_id not in ours and run.jobs], only_new=True)
            self._export(store, on_disk=self._export_bytes())
        return added, len(theirs) - len(added)

    def prune(self, choose, dry_run: bool = False) -> list[RunRecords]:
        """Remove the runs ``choose(store)`` names from the database and the export (the one command that shrinks
        them), deciding and removing under one lock, so a run that lands meanwhile is never among them; returns
        the runs removed (or that would be, with ``dry_run``)."""
        if not self.exists():  # a mistyped --out: nothing to prune, and no folder made for it
            raise FolderError(f"--out: no results database at {str(self.database)!r} nor its export {EXPORT}: "
                              "nothing to prune")
        if dry_run:
            store = self.for_reading()
            chosen = set(choose(store))
            return [run for run_id, run in sorted(store.records().items()) if run_id in chosen]
        self.path_must_be_writable()
        with self._locked():
            store = self._joined_store()
            known = store.records()  # what there is to decide on: a run recorded from here on is not among them
            chosen = set(choose(store))
            doomed = [run for run_id, run in sorted(known.items()) if run_id in chosen]
            if doomed:
                store.remove(run.run_id for run in doomed)
                self._export(store, on_disk=self._export_bytes())
        return doomed


def checked(store: Store, label: str | None = None) -> dict[str, RunRecords]:
    """Every run ``store`` holds, each row checked against the one schema (a database edited by hand or by
    another tool is refused in one line naming it, before anything of it is exported or merged)."""
    records = store.records()
    try:
        return check_records((f"{label or store.label} ({table} of run {run.run_id!r})", {"table": table, **record})
                             for run in records.values()
                             for table, rows in (("runs", [run.run]), ("jobs", run.jobs), ("results", run.results))
                             for record in rows)
    except ExportError as exc:
        raise StoreError(str(exc)) from None


def read_runs(source: Path) -> dict[str, RunRecords]:
    """The runs of a results database or an export file (told apart by content, or a database's name), each
    checked."""
    if source.is_dir():
        raise FolderError(f"DATABASE: {str(source)!r} is a folder; give its {DATABASE} or its {EXPORT}")
    if not source.is_file():
        raise FolderError(f"DATABASE: no such file {str(source)!r}")
    with open(source, "rb") as handle:
        is_database = handle.read(len(SQLITE_HEADER)) == SQLITE_HEADER
    if is_database or source.suffix in (".sqlite", ".sqlite3", ".db"):  # an empty or damaged one says so
        return checked(Store(source, readonly=True))
    return read_export(source)


def _move_into_place(staged: Path, target: Path) -> None:
    """Rename a staged file over its target; where the staging folder is on another filesystem (``.zoo-cache`` a
    link to one), copy it beside the target first, so the replacing rename is still atomic."""
    try:
        os.replace(staged, target)
    except OSError as exc:
        if exc.errno != errno.EXDEV:
            raise
        beside = target.with_name(f".{target.name}.{uuid.uuid4().hex[:8]}.zoo-staged")
        try:
            shutil.copyfile(staged, beside)
            with open(beside, "rb+") as handle:
                os.fsync(handle.fileno())  # its bytes on disk before its name is
            os.replace(beside, target)
        finally:
            beside.unlink(missing_ok=True)
        # the staged copy stays until the folder is synced: on another filesystem, its removal could reach the
        # disk before the rename, and a journal finished after a power cut would then find nothing to put in place


def _plain_name(name: str) -> bool:
    return isinstance(name, str) and name not in ("", ".", "..") and Path(name).name == name


def _journal(path: Path) -> dict | None:
    """A journal as the zoo writes it, or None for anything else (the file is then dropped, nothing applied)."""
    try:
        plan = json.loads(path.read_text())
    except (OSError, ValueError, UnicodeDecodeError, RecursionError):  # RecursionError: nested too deeply
        return None
    if not isinstance(plan, dict) or not isinstance(plan.get("staging"), str) or not isinstance(plan.get("before"), dict):
        return None
    names = [*plan.get("files", ()), *plan.get("remove", ())] if all(
        isinstance(plan.get(key), list) for key in ("files", "remove")) else None
    if (names is None or not plan["staging"].startswith(STAGING) or not _plain_name(plan["staging"])
            or not all(_plain_name(name) for name in names) or any(name in KEPT for name in plan["remove"])):
        return None
    return plan


def _span(run: RunRecords, digest: str) -> dict[str, tuple[str, int, int]]:
    """Where the export ``run`` was read from holds its lines as the zoo writes them (``digest``: its
    :meth:`~zoo.export.RunRecords.digest`), as :meth:`zoo.store.Store.exported_spans` gives it; none where that
    export holds them otherwise (not contiguous, or written differently)."""
    if run.read_at is None or run.read_at[2] != digest:
        return {}
    return {run.run_id: (digest, *run.read_at[:2])}


def _kept_runs(spans: dict[str, tuple[str, int, int]], data: bytes | None) -> dict[str, bytes]:
    """The runs ``data`` (an export's bytes) still holds where ``spans`` says, with the digest it says."""
    if data is None:
        return {}
    kept = {}
    for run_id, (digest, start, length) in spans.items():
        text = data[start:start + length]
        if len(text) == length and (start == 0 or data[start - 1:start] == b"\n") \
                and data[start + length:start + length + 1] == b"\n" and hashlib.sha256(text).hexdigest() == digest:
            kept[run_id] = text
    return kept


def _sha256(data: bytes | None) -> str | None:
    """An export's sha256 (None: there is none), taken once per join: a board's export is tens of megabytes."""
    return None if data is None else hashlib.sha256(data).hexdigest()


def _digest(path: Path) -> str | None:
    """What a file holds now (None: no file)."""
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        return None
    except OSError:
        return "unreadable"


def _write_durably(path: Path, content: bytes) -> None:
    with open(path, "wb") as handle:
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def _sync_folder(folder: Path) -> None:
    """Put a folder's entries (the renames and removals made in it) on disk: without it a power cut could keep the
    removal of a journal and lose the renames it was kept to finish, leaving a board part old, part new."""
    try:
        descriptor = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        if exc.errno in (errno.EACCES, errno.EPERM):  # a folder that can be written and not read: it cannot be synced
            return
        raise
    try:
        os.fsync(descriptor)
    except OSError as exc:
        if exc.errno not in _CANNOT_SYNC_A_FOLDER:
            raise
    finally:
        os.close(descriptor)


_CANNOT_SYNC_A_FOLDER = {errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP, errno.EBADF}
"""What fsync of a folder raises on a filesystem that cannot sync one: there is nothing more to do there."""


def resolve_run(store: Store, given: str, where: Path | str, label: str = "") -> str:
    """The run of ``store`` whose id is ``given`` or starts with it; one match, else a one-line error listing the
    runs (``where``: the folder's database, named in it; ``label``: the option it came from, e.g. ``--run: ``)."""
    runs = list(store.runs().run_id)
    matches = [r for r in runs if r == given] or [r for r in runs if r.startswith(given)]
    if len(matches) != 1:
        raise OptionError(f"{label}run {given!r} matches {len(matches)} runs in {str(where)!r} (runs: {', '.join(runs)})")
    return matches[0]
