"""The results store: SQLite (standard library), one file in the output folder, or an in-memory copy.

Each finished job is written in one transaction with all its rows, so an interrupted run keeps every
finished job and ``--resume`` can skip them. WAL mode and a busy timeout let concurrent runs write to
the same file. Nothing read back is unpickled or evaluated: values are plain columns and JSON text.

A file is checked before anything touches it (a zoo database, undamaged, not from a newer zoo); one that
fails is refused in one line and left as it was. Every SQLite failure later on is one :class:`StoreError`
naming the file, and a full disk is called that, not a bad database.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

import pandas as pd

from .checks import RESULT_FIELDS
from .contract import ZooError
from .export import EXPORT, OPTIONAL, TABLE_COLUMNS, RunRecords, storable

RESULT_COLUMNS = ["variant", "suite", *RESULT_FIELDS]

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    started TEXT NOT NULL,
    profile TEXT NOT NULL,
    settings TEXT NOT NULL,
    environment TEXT NOT NULL,
    finished TEXT,
    job_count INTEGER
);
CREATE TABLE IF NOT EXISTS jobs (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    variant TEXT NOT NULL,
    suite TEXT NOT NULL,
    status TEXT NOT NULL,
    seconds REAL,
    provenance TEXT NOT NULL,
    row_count INTEGER,
    PRIMARY KEY (run_id, variant, suite)
);
CREATE TABLE IF NOT EXISTS results (
    run_id TEXT NOT NULL,
    variant TEXT NOT NULL,
    suite TEXT NOT NULL,
    "check" TEXT NOT NULL,
    setting TEXT,
    status TEXT NOT NULL,
    value REAL,
    unit TEXT,
    detail TEXT,
    n INTEGER,
    mode TEXT,
    phase TEXT,
    samples TEXT,
    versus TEXT NOT NULL DEFAULT '',
    params TEXT,
    low REAL,
    high REAL,
    batch INTEGER
);
CREATE INDEX IF NOT EXISTS results_by_run ON results (run_id, variant, suite);
CREATE TABLE IF NOT EXISTS exported (
    run_id TEXT PRIMARY KEY,
    digest TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS exported_spans (
    run_id TEXT PRIMARY KEY,
    digest TEXT NOT NULL,
    start INTEGER NOT NULL,
    length INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS generation (value INTEGER NOT NULL);
INSERT INTO generation (value) SELECT 0 WHERE NOT EXISTS (SELECT 1 FROM generation);
CREATE TABLE IF NOT EXISTS agreement (export_sha256 TEXT NOT NULL, generation INTEGER NOT NULL);
""" + "".join(f"CREATE TRIGGER IF NOT EXISTS {table}_{event.lower()} AFTER {event} ON {table} "
              "BEGIN UPDATE generation SET value = value + 1; END;\n"
              for table in ("runs", "jobs", "results", "exported") for event in ("INSERT", "UPDATE", "DELETE")) \
    + "".join(f"CREATE TRIGGER IF NOT EXISTS {table}_{event.lower()}_span AFTER {event} ON {table} "
              f"BEGIN DELETE FROM exported_spans WHERE run_id IN ({', '.join(f'{row}.run_id' for row in rows)}); END;\n"
              for table in ("runs", "jobs", "results")
              for event, rows in (("INSERT", ("NEW",)), ("UPDATE", ("OLD", "NEW")), ("DELETE", ("OLD",))))
# exported: the digest of each run as the folder's runs.jsonl last held it (written or read), so a run that
# differs between the database and the export can be told apart: changed here since, changed there (a
# git pull), or both (a conflict).
# exported_spans: where the export last written from this store holds each run (its bytes' start and length, and
# their sha256), while nothing of that run has been written since (its triggers forget a run on any write to it), so
# the next export copies those bytes instead of serialising the run again
# generation: how many rows of runs, jobs, results and exported have been written (its triggers count every
# insert, update and delete, whoever makes it); agreement: the sha256 of an export that holds exactly this
# store's runs, and the generation at which that was established (it holds while the generation has not moved)

SCHEMA_VERSION = 10
"""``PRAGMA user_version`` of a store this zoo writes (9: before ``exported_spans``; 8: before runs had ``job_count``; 7: before jobs had
``row_count``; 6: before ``generation`` and ``agreement``; 5: before rows had
``batch``; 4: before rows had ``low`` and
``high``; 3: before rows had
``versus`` and ``params``; 2: before
``exported``; 1: before per-round samples were kept; 0: a store written before the version was recorded, read as
1). An older store gains what it lacks when first opened for writing; a newer one is refused, never converted."""
ADDED_COLUMNS = {("results", "samples"): "TEXT", ("results", "versus"): "TEXT NOT NULL DEFAULT ''",
                 ("results", "params"): "TEXT", ("results", "low"): "REAL", ("results", "high"): "REAL",
                 ("results", "batch"): "INTEGER", ("jobs", "row_count"): "INTEGER",
                 ("runs", "job_count"): "INTEGER"}
"""Columns added since the first stores, by (table, column), as an older store gains them."""
SQLITE_HEADER = b"SQLite format 3\x00"
ZOO_TABLES = {"runs", "jobs", "results"}


class StoreError(ZooError):
    """The results database cannot be used: not a zoo database, damaged, from a newer zoo, or its disk is full."""


def disk_full(path: Path) -> str:
    """'no space left on the disk holding PATH (...)': what a full disk is called everywhere."""
    path = Path(path).resolve()
    mount = next((p for p in (path, *path.parents) if p.exists() and os.path.ismount(p)), Path("/"))
    try:
        free = f", {shutil.disk_usage(mount).free / 2 ** 20:.1f} MiB free"
    except OSError:
        free = ""
    return f"no space left on the disk holding {str(path)!r} (the filesystem mounted at {mount}{free})"


def _is_disk_full(exc: BaseException) -> bool:
    return getattr(exc, "sqlite_errorcode", None) == 13 or "disk is full" in str(exc) or getattr(exc, "errno", 0) == 28


def _nearly_full(folder: Path) -> bool:
    """Too little room for SQLite's own files (its WAL index, a journal): it then reports I/O errors instead."""
    try:
        return shutil.disk_usage(folder).free < 2 ** 20
    except OSError:
        return False


class Store:
    """A results database. ``readonly`` stores never write (no WAL switch, no CREATE, no migration): a merge's
    source is opened so, and on read-only media it is read as an immutable file. :meth:`in_memory` gives a
    store that lives in this process only: what a command that must not write sees."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly
        self._uri: str | None = None
        self._anchor: sqlite3.Connection | None = None  # keeps an in-memory database alive
        self._checked = False

    @classmethod
    def in_memory(cls, label: str) -> "Store":
        """An empty store in this process's memory (``label`` is what messages call it)."""
        store = cls(label)
        store._uri, store._anchor = _memory_database()
        store._anchor.executescript(SCHEMA)
        store._anchor.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        store._checked = True
        return store

    @property
    def in_memory_only(self) -> bool:
        """Whether the store lives in this process only (nothing it records outlives the command)."""
        return self._uri is not None

    @property
    def label(self) -> str:
        """What messages call the store: its path."""
        return str(self.path)

    # --- connections -------------------------------------------------------------------------------------

    def _connect(self) -> sqlite3.Connection:
        if self._uri:
            return sqlite3.connect(self._uri, uri=True)
        if not self._checked:
            self._check_file()
        if self.readonly:
            return self._open_read_only()
        try:
            connection = sqlite3.connect(self.path, timeout=60)
            connection.execute("PRAGMA busy_timeout=60000")
            if connection.execute("PRAGMA user_version").fetchone()[0] < SCHEMA_VERSION:
                connection.execute("PRAGMA journal_mode=WAL")
                _upgrade(connection)
        except sqlite3.Error as exc:
            raise self._failure(exc) from None
        return connection

    def _open_read_only(self) -> sqlite3.Connection:
        """Read-only, never writing beside the file; on read-only media (where SQLite cannot make the WAL index a
        read needs) the file is opened as immutable: nothing can be writing it there, and a write-ahead log it would
        not read (changes not yet folded into the file) is read with it from a copy (:meth:`_read_with_log`)."""
        uri = self.path.resolve().as_uri()
        connection = None
        try:
            connection = sqlite3.connect(f"{uri}?mode=ro", uri=True, timeout=60)
            connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return connection
        except sqlite3.DatabaseError as exc:  # closed now, not when the error's frames go: it holds the file open
            if connection is not None:
                connection.close()
            if not isinstance(exc, sqlite3.OperationalError) or os.access(self.path.parent, os.W_OK):
                raise self._failure(exc) from None
        wal = self.path.with_name(f"{self.path.name}-wal")
        if wal.is_file() and wal.stat().st_size > 0:  # immutable would read the file alone, not the log's changes
            return self._read_with_log(wal)
        try:
            connection = sqlite3.connect(f"{uri}?immutable=1", uri=True)
            connection.execute("SELECT COUNT(*) FROM sqlite_master").fetchone()
            return connection
        except sqlite3.Error as exc:
            raise self._failure(exc) from None

    def _read_with_log(self, wal: Path) -> sqlite3.Connection:
        """On read-only media, a database with a write-ahead log beside it and no -shm (a killed run's store copied
        elsewhere): SQLite reads the log only where it can make the -shm, so the two are copied to a temporary
        folder, read there together, and kept in memory for the store's later reads; the media is never written."""
        if self._uri is None:
            try:
                with tempfile.TemporaryDirectory(prefix="zoo-read-") as scratch:
                    copy = Path(scratch) / self.path.name
                    shutil.copyfile(self.path, copy)
                    shutil.copyfile(wal, copy.with_name(wal.name))
                    source = sqlite3.connect(copy)
                    try:
                        memory, anchor = _memory_database()
                        source.backup(anchor)
                    finally:
                        source.close()
            except (OSError, sqlite3.Error) as exc:
                raise StoreError(f"{self.label!r}: on read-only media with its write-ahead log {wal.name}, it is "
                                 f"read from a temporary copy, which failed ({exc})") from None
            self._uri, self._anchor = memory, anchor
        return sqlite3.connect(self._uri, uri=True)

    def _check_file(self) -> None:
        """Refuse, before any write, a file that is not an undamaged zoo database of a version this zoo reads.
        A missing file is fine for a writable store (it is created), an error for a read-only one."""
        if not self.path.exists():
            if self.readonly:
                raise StoreError(f"no results database at {self.label!r}")
            self._checked = True
            return
        try:
            with open(self.path, "rb") as handle:
                header = handle.read(len(SQLITE_HEADER))
        except OSError as exc:
            raise StoreError(f"cannot read results database {self.label!r} ({exc.strerror or exc})") from None
        if not header:
            raise StoreError(f"{self.label!r} is empty (0 bytes), not a zoo results database; it was left as it is "
                             f"(remove it: the folder's {EXPORT}, if any, keeps the board's runs)")
        if header != SQLITE_HEADER:
            raise StoreError(f"{self.label!r} is not a zoo results database (not an SQLite file); it was left as it is")
        connection = self._open_read_only()
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{self.label!r} was written by a newer zoo (schema {version}; this zoo reads up "
                                 f"to {SCHEMA_VERSION}): upgrade attention-zoo to use it")
            verdict = connection.execute("PRAGMA quick_check").fetchall()
            if verdict != [("ok",)]:
                problem = "; ".join(str(row[0]) for row in verdict[:2])
                raise StoreError(f"{self.label!r} is a damaged results database ({problem}); it was left as it is")
            tables = {row[0] for row in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            if not ZOO_TABLES <= tables:
                raise StoreError(f"{self.label!r} is not a zoo results database (it has no "
                                 f"{', '.join(sorted(ZOO_TABLES - tables))} table); it was left as it is")
            for table in sorted(ZOO_TABLES):
                present = _columns(connection, table)
                missing = [c for c in TABLE_COLUMNS[table] if c not in present and (table, c) not in ADDED_COLUMNS]
                if missing:
                    raise StoreError(f"{self.label!r} is not a zoo results database (its {table} table has no "
                                     f"{', '.join(missing)} column); it was left as it is")
        except sqlite3.DatabaseError as exc:
            raise self._failure(exc) from None
        finally:
            connection.close()
        self._checked = True

    def _failure(self, exc: BaseException) -> StoreError:
        if self._uri is None and (_is_disk_full(exc) or _nearly_full(self.path.parent)):
            return StoreError(f"{disk_full(self.path.parent)} while using {self.label!r}; what it held before "
                              "is kept")
        return StoreError(f"{self.label!r} is not a usable zoo results database ({exc})")

    @contextmanager
    def _db(self) -> Iterator[sqlite3.Connection]:
        """A connection for one transaction: committed when the block ends, rolled back on an error; every
        SQLite failure becomes a :class:`StoreError` naming the file."""
        connection = self._connect()
        try:
            with connection:
                yield connection
        except (sqlite3.Error, pd.errors.DatabaseError) as exc:
            raise self._failure(exc.__cause__ if isinstance(exc.__cause__, sqlite3.Error) else exc) from None
        finally:
            connection.close()

    def check(self) -> None:
        """Refuse now, in one line, a file this store could not use."""
        with self._db() as db:
            db.execute("SELECT COUNT(*) FROM runs").fetchone()

    # --- a run as it happens -----------------------------------------------------------------------------

    def start_run(self, settings: dict, environment: dict, started: str) -> str:
        """Record a new run with its profile settings and environment fingerprint; return its id."""
        run_id = f"{started.replace(' ', 'T').replace(':', '')[:15]}-{uuid.uuid4().hex[:6]}"
        with self._db() as db:
            db.execute("INSERT INTO runs (run_id, started, profile, settings, environment, job_count) "
                       "VALUES (?, ?, ?, ?, ?, 0)",
                       (run_id, started, settings["name"], json.dumps(settings, sort_keys=True),
                        json.dumps(environment, sort_keys=True)))
        return run_id

    def finish_run(self, run_id: str, finished: str) -> None:
        """Mark a run finished."""
        with self._db() as db:
            if db.execute("UPDATE runs SET finished = ? WHERE run_id = ?", (finished, run_id)).rowcount == 0:
                raise self._gone(run_id, "it was not marked finished")

    def record_job(self, run_id: str, variant: str, suite: str, status: str, seconds: float,
                   provenance: dict, rows: Iterable[dict]) -> None:
        """All of a job's rows and its completion marker, in one transaction; every row as the export can read
        it back (:func:`~zoo.export.storable`: one a plugin got wrong is stored as an error row saying why)."""
        kept = storable(rows)
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")  # the run's presence and the job's rows in one transaction
            if not db.execute("SELECT 1 FROM runs WHERE run_id = ?", (run_id,)).fetchone():
                raise self._gone(run_id, f"its {variant}/{suite} job was not recorded")
            db.execute("DELETE FROM results WHERE run_id = ? AND variant = ? AND suite = ?", (run_id, variant, suite))
            db.execute("DELETE FROM jobs WHERE run_id = ? AND variant = ? AND suite = ?", (run_id, variant, suite))
            db.executemany(
                f"INSERT INTO results (run_id, {_COLUMN_LIST}) VALUES (?, {', '.join('?' * len(RESULT_COLUMNS))})",
                [(run_id, variant, suite, *(r[name] for name in RESULT_FIELDS)) for r in kept],
            )
            db.execute("INSERT INTO jobs (run_id, variant, suite, status, seconds, provenance, row_count) "
                       "VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (run_id, variant, suite, status, seconds, json.dumps(provenance, sort_keys=True), len(kept)))
            db.execute("UPDATE runs SET job_count = (SELECT COUNT(*) FROM jobs WHERE run_id = ?) WHERE run_id = ?",
                       (run_id, run_id))

    def _gone(self, run_id: str, consequence: str) -> StoreError:
        """A run removed from the store while it ran (``zoo prune`` names runs by id): its writes are refused, not
        left as rows of no run, which no board shows and no export keeps."""
        return StoreError(f"run {run_id!r} is no longer in {self.label!r} (removed by `zoo prune` while it ran?): "
                          f"{consequence}")

    def finished_jobs(self, run_id: str, without_errors: bool = False) -> set[tuple[str, str]]:
        """(variant, suite) of the run's recorded jobs; ``without_errors``: only those that did not err."""
        query = "SELECT variant, suite FROM jobs WHERE run_id = ?" + (" AND status != 'error'" if without_errors else "")
        with self._db() as db:
            return set(db.execute(query, (run_id,)).fetchall())

    def discard_if_empty(self, run_id: str) -> None:
        """Remove a run that recorded no job (it failed or was stopped before any finished)."""
        with self._db() as db:
            if db.execute("SELECT COUNT(*) FROM jobs WHERE run_id = ?", (run_id,)).fetchone()[0] == 0:
                db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    # --- reading ---------------------------------------------------------------------------------------------

    def runs(self) -> pd.DataFrame:
        """Every run, oldest first."""
        with self._db() as db:
            return pd.read_sql_query("SELECT * FROM runs ORDER BY started, run_id", db)

    def latest_run(self, unfinished: bool = False) -> str | None:
        """The id of the latest run (``unfinished``: of those not finished), or None."""
        runs = self.runs()
        if unfinished:
            runs = runs[runs["finished"].isna()]
        return None if runs.empty else str(runs["run_id"].iloc[-1])

    def environment(self, run_id: str) -> dict:
        """A run's environment fingerprint."""
        return self._run_json(run_id, "environment")

    def settings(self, run_id: str) -> dict:
        """A run's settings (its profile, as recorded)."""
        return self._run_json(run_id, "settings")

    def _run_json(self, run_id: str, column: str) -> dict:
        with self._db() as db:
            row = db.execute(f"SELECT {column} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return json.loads(row[0]) if row else {}

    def results(self, run_id: str, suites: Iterable[str] | None = None) -> pd.DataFrame:
        """A run's rows (``suites``: only theirs), samples and params read back as lists and dicts (a read-only
        older store: without them)."""
        suites = None if suites is None else [suites] if isinstance(suites, str) else list(suites)
        where = "" if suites is None else f" AND suite IN ({', '.join('?' * len(suites))})"
        with self._db() as db:
            present = _columns(db, "results")
            selected = ", ".join(f'"{c}"' if c in present else f'{_absent("results", c)} AS "{c}"'
                                 for c in RESULT_COLUMNS)
            frame = pd.read_sql_query(f"SELECT {selected} FROM results WHERE run_id = ?{where}", db,
                                      params=(run_id, *(suites or ())))
        for column in ("n", "batch"):
            frame[column] = frame[column].astype("Int64")
        for column in ("samples", "params"):
            frame[column] = frame[column].map(lambda text: json.loads(text) if isinstance(text, str) else None)
        return frame

    def device_kinds(self, run_id: str) -> list[str]:
        """The device kinds a run's jobs ran on: each job's own record (on a Ray cluster, not always the
        machine that started the run), else the run's fingerprint."""
        environment = self.environment(run_id)
        kinds = {device_kind(p.get("ran_on") or environment) for p in self.jobs(run_id).provenance}
        return sorted(kinds) or [device_kind(environment)]

    def jobs(self, run_id: str) -> pd.DataFrame:
        """A run's jobs, provenance read back as dicts."""
        with self._db() as db:
            frame = pd.read_sql_query("SELECT * FROM jobs WHERE run_id = ?", db, params=(run_id,))
        frame["provenance"] = frame["provenance"].map(json.loads)
        return frame

    # --- whole runs, as the export holds them ----------------------------------------------------------------

    def records(self, run_ids: Iterable[str] | None = None) -> dict[str, RunRecords]:
        """The runs (all, or ``run_ids``) as :class:`~zoo.export.RunRecords`, rows in the order written."""
        with self._db() as db:
            wanted = None if run_ids is None else sorted(set(run_ids))
            if wanted == []:
                return {}
            where = "" if wanted is None else f" WHERE run_id IN ({', '.join('?' * len(wanted))})"
            runs: dict[str, RunRecords] = {}
            for table, columns in TABLE_COLUMNS.items():
                present = _columns(db, table)
                select = ", ".join(f'"{c}"' if c in present else f'{_absent(table, c)} AS "{c}"' for c in columns)
                for row in db.execute(f"SELECT {select} FROM {table}{where} ORDER BY rowid", wanted or ()):
                    record = dict(zip(columns, row))
                    if table == "runs":
                        runs[record["run_id"]] = RunRecords(record)
                    elif record["run_id"] in runs:
                        getattr(runs[record["run_id"]], table).append(record)
        return runs

    def add(self, runs: Iterable[RunRecords], exported: dict[str, str] | None = None, only_new: bool = False,
            agree: tuple[str, int] | None = None, spans: dict[str, tuple[str, int, int]] | None = None) -> list[str]:
        """Write ``runs`` in one transaction and record ``exported`` digests; ``only_new``: skip runs the store
        already holds, decided inside the transaction (two processes adding the same runs at once add them
        once); ``agree``: (export sha256, generation) as for :meth:`agree`, recorded after the writes, and with it
        ``spans``, where that export holds each run (as :meth:`exported_spans` gives them). Returns the ids
        written."""
        runs = list(runs)
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            with _agreeing(db, agree) as agreed:
                present = {row[0] for row in db.execute("SELECT run_id FROM runs")}
                written = []
                for run in runs:
                    if only_new and run.run_id in present:
                        continue
                    for table, records in (("runs", [run.run]), ("jobs", run.jobs), ("results", run.results)):
                        columns = TABLE_COLUMNS[table]
                        names = ", ".join(f'"{c}"' for c in columns)
                        db.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})",
                                       [tuple(r[c] for c in columns) for r in records])
                    written.append(run.run_id)
                if exported:
                    db.executemany("INSERT OR REPLACE INTO exported VALUES (?, ?)", sorted(exported.items()))
                if agreed and spans is not None:
                    _set_spans(db, spans)
        return written

    def remove(self, run_ids: Iterable[str]) -> None:
        """Delete runs (every job and row) in one transaction: only ``zoo prune`` does this."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            for run_id in run_ids:
                _delete_run(db, run_id)

    def exported(self) -> dict[str, str]:
        """Each run's digest as the folder's export last held it (empty for a store from before this was kept)."""
        with self._db() as db:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'exported'").fetchone():
                return {}
            return dict(db.execute("SELECT run_id, digest FROM exported").fetchall())

    def set_exported(self, digests: dict[str, str], agree: tuple[str, int] | None = None,
                     spans: dict[str, tuple[int, int]] | None = None) -> None:
        """Record each run's digest as the export now holds it; ``agree`` as for :meth:`add`; ``spans``: where that
        export, written from this store, holds each run (start, length in bytes), recorded with the agreement only
        (nothing written to the store since ``agree``'s generation), for :meth:`exported_spans`."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            with _agreeing(db, agree) as agreed:
                db.executemany("INSERT OR REPLACE INTO exported VALUES (?, ?)", sorted(digests.items()))
                if agreed and spans is not None:
                    _set_spans(db, {run_id: (digests[run_id], *span) for run_id, span in spans.items()})

    def exported_spans(self) -> dict[str, tuple[str, int, int]]:
        """Each run that has not been written to since an export was written from this store: (its sha256, start
        and length in bytes) as that export holds it. Copy a run from there only where the bytes found there still
        have that sha256 (the file may have changed since: a git pull)."""
        with self._db() as db:
            if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'exported_spans'").fetchone():
                return {}
            return {run_id: (digest, start, length) for run_id, digest, start, length
                    in db.execute("SELECT run_id, digest, start, length FROM exported_spans")}

    # --- agreement with the export: what lets a command skip joining them -----------------------------------

    def generation(self) -> int | None:
        """How many writes the store's runs, jobs, rows and export digests have had (its triggers count each one,
        whoever makes it): the same number at two moments means nothing was written between. None for a store
        from before it was counted."""
        with self._db() as db:
            return _generation(db)

    def agree(self, export_sha256: str, generation: int, spans: dict[str, tuple[str, int, int]] | None = None) -> None:
        """Record that the export with this sha256 holds exactly this store's runs, as established at
        ``generation``: recorded only if nothing was written since (another process may have been writing); with it
        ``spans``, where that export holds each run (as :meth:`exported_spans` gives them)."""
        with self._db() as db:
            db.execute("BEGIN IMMEDIATE")
            with _agreeing(db, (export_sha256, generation)) as agreed:
                if agreed and spans is not None:
                    _set_spans(db, spans)

    def agreed_export(self) -> str | None:
        """The sha256 of the export this store last agreed with, if nothing was written to it since; else None."""
        with self._db() as db:
            if _generation(db) is None:
                return None
            row = db.execute("SELECT export_sha256 FROM agreement JOIN generation "
                             "ON agreement.generation = generation.value").fetchone()
            return row[0] if row else None

    def copy_to_memory(self) -> "Store":
        """This store's contents in a :meth:`in_memory` store (the file is only read)."""
        memory = Store.in_memory(f"{self.label} (a copy in memory)")
        with self._db() as db:
            db.backup(memory._anchor)
        with memory._db() as db:  # a copy of an older store: the tables this zoo expects
            _upgrade(db)
        return memory


def _memory_database() -> tuple[str, sqlite3.Connection]:
    """A new database in this process's memory: its URI, and the connection that keeps it alive while it is open."""
    uri = f"file:zoo-memory-{uuid.uuid4().hex}?mode=memory&cache=shared"
    return uri, sqlite3.connect(uri, uri=True)


def _absent(table: str, column: str) -> str:
    """What an older store's missing column reads as: what an export line without it holds."""
    return "''" if OPTIONAL.get((table, column)) == "" else "NULL"


def _upgrade(db: sqlite3.Connection) -> None:
    """An older store's tables as this zoo writes them (what it lacks is added; nothing is removed)."""
    db.executescript(SCHEMA)
    for (table, column), kind in ADDED_COLUMNS.items():
        if column not in _columns(db, table):
            db.execute(f"ALTER TABLE {table} ADD COLUMN {column} {kind}")
    db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")


def _generation(db: sqlite3.Connection) -> int | None:
    """The store's write count (see :meth:`Store.generation`)."""
    if not db.execute("SELECT 1 FROM sqlite_master WHERE name = 'generation'").fetchone():
        return None
    return db.execute("SELECT value FROM generation").fetchone()[0]


@contextmanager
def _agreeing(db: sqlite3.Connection, agree: tuple[str, int] | None):
    """The writes made inside it (in the caller's transaction), then ``agree`` = (export sha256, generation) recorded
    as the store's agreement if the store had not been written since that generation when they began (what it
    yields: whether it will be)."""
    unchanged = agree is not None and _generation(db) == agree[1]
    yield unchanged
    if unchanged:
        _set_agreement(db, agree[0])


def _set_spans(db: sqlite3.Connection, spans: dict[str, tuple[str, int, int]]) -> None:
    """Where the export now on disk holds each run (sha256, start, length): every span of an earlier export goes."""
    db.execute("DELETE FROM exported_spans")
    db.executemany("INSERT INTO exported_spans VALUES (?, ?, ?, ?)",
                   [(run_id, *span) for run_id, span in sorted(spans.items())])


def _set_agreement(db: sqlite3.Connection, export_sha256: str) -> None:
    db.execute("DELETE FROM agreement")
    db.execute("INSERT INTO agreement SELECT ?, value FROM generation", (export_sha256,))


def _delete_run(db: sqlite3.Connection, run_id: str) -> None:
    for table in (*TABLE_COLUMNS, "exported"):
        db.execute(f"DELETE FROM {table} WHERE run_id = ?", (run_id,))


def device_kind(environment: dict) -> str:
    """What figures are comparable across: the GPU for cuda runs, else the CPU model (``environment``
    is a run's fingerprint or a job's ``ran_on``)."""
    device = environment.get("device", "?")
    return device if device != "cpu" else f"cpu: {environment.get('cpu', '?')}"


_COLUMN_LIST = ", ".join(f'"{c}"' for c in RESULT_COLUMNS)


def _columns(db: sqlite3.Connection, table: str) -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA table_info({table})")}
