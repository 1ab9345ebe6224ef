"""The results store: SQLite (standard library), one file in the output folder.

Each finished job is written in one transaction with all its rows, so an interrupted run keeps every
finished job and ``--resume`` can skip them. WAL mode and a busy timeout let concurrent runs write to
the same file. Nothing read back is unpickled or evaluated: values are plain columns and JSON text.
"""

from __future__ import annotations

import json
import os
import sqlite3
import uuid
from contextlib import closing
from pathlib import Path
from typing import Iterable

import pandas as pd

from .checks import RESULT_FIELDS
from .contract import ZooError

RESULT_COLUMNS = ["variant", "suite", *RESULT_FIELDS]
DATABASE = "results.sqlite"
EXPORT = "runs.jsonl"
"""Beside a board: its runs as JSON lines (:func:`export_runs`), committed in place of the database."""

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id TEXT PRIMARY KEY,
    started TEXT NOT NULL,
    profile TEXT NOT NULL,
    settings TEXT NOT NULL,
    environment TEXT NOT NULL,
    finished TEXT
);
CREATE TABLE IF NOT EXISTS jobs (
    run_id TEXT NOT NULL REFERENCES runs(run_id),
    variant TEXT NOT NULL,
    suite TEXT NOT NULL,
    status TEXT NOT NULL,
    seconds REAL,
    provenance TEXT NOT NULL,
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
    samples TEXT
);
CREATE INDEX IF NOT EXISTS results_by_run ON results (run_id, variant, suite);
"""


SCHEMA_VERSION = 2
"""``PRAGMA user_version`` of a store this zoo writes (1: before per-round samples were kept; 0: a store
written before the version was recorded, read as 1). A newer store is refused, never converted."""


class StoreError(ZooError):
    """The results database cannot be used: not a zoo database, damaged, or from a newer zoo."""


class Store:
    """A results database. ``readonly`` stores never write (no WAL switch, no CREATE, no migration):
    commands that only read (``zoo leaderboard``, ``zoo compare``, a merge's source) open them so."""

    def __init__(self, path: str | Path, readonly: bool = False) -> None:
        self.path = Path(path)
        self.readonly = readonly

    def _connect(self) -> sqlite3.Connection:
        try:
            if self.readonly:
                connection = sqlite3.connect(f"{self.path.resolve().as_uri()}?mode=ro", uri=True, timeout=60)
            else:
                connection = sqlite3.connect(self.path, timeout=60)
        except sqlite3.Error as exc:
            raise StoreError(f"cannot open results database {str(self.path)!r}: {exc}") from None
        try:
            version = connection.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise StoreError(f"{str(self.path)!r} was written by a newer zoo (schema {version}; this zoo reads up "
                                 f"to {SCHEMA_VERSION}): upgrade attention-zoo to use it")
            if not self.readonly:
                connection.execute("PRAGMA journal_mode=WAL")
                connection.execute("PRAGMA busy_timeout=60000")
                connection.executescript(SCHEMA)
                if "samples" not in _columns(connection):  # a store written before per-round samples were kept
                    connection.execute("ALTER TABLE results ADD COLUMN samples TEXT")
                connection.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        except sqlite3.DatabaseError as exc:
            connection.close()
            raise StoreError(f"{str(self.path)!r} is not a usable zoo results database ({exc})") from None
        except StoreError:
            connection.close()
            raise
        return connection

    def start_run(self, settings: dict, environment: dict, started: str) -> str:
        """Record a new run with its profile settings and environment fingerprint; return its id."""
        run_id = f"{started.replace(' ', 'T').replace(':', '')[:15]}-{uuid.uuid4().hex[:6]}"
        with closing(self._connect()) as db, db:
            db.execute("INSERT INTO runs (run_id, started, profile, settings, environment) VALUES (?, ?, ?, ?, ?)",
                       (run_id, started, settings["name"], json.dumps(settings, sort_keys=True),
                        json.dumps(environment, sort_keys=True)))
        return run_id

    def finish_run(self, run_id: str, finished: str) -> None:
        with closing(self._connect()) as db, db:
            db.execute("UPDATE runs SET finished = ? WHERE run_id = ?", (finished, run_id))

    def record_job(self, run_id: str, variant: str, suite: str, status: str, seconds: float,
                   provenance: dict, rows: Iterable[dict]) -> None:
        """All of a job's rows and its completion marker, in one transaction."""
        with closing(self._connect()) as db, db:
            db.execute("DELETE FROM results WHERE run_id = ? AND variant = ? AND suite = ?", (run_id, variant, suite))
            db.executemany(
                f"INSERT INTO results (run_id, {_COLUMN_LIST}) VALUES (?, {', '.join('?' * len(RESULT_COLUMNS))})",
                [(run_id, variant, suite, *(_column(name, r.get(name)) for name in RESULT_FIELDS)) for r in rows],
            )
            db.execute("INSERT OR REPLACE INTO jobs VALUES (?, ?, ?, ?, ?, ?)",
                       (run_id, variant, suite, status, seconds, json.dumps(provenance, sort_keys=True)))

    def finished_jobs(self, run_id: str, without_errors: bool = False) -> set[tuple[str, str]]:
        """(variant, suite) of the run's recorded jobs; ``without_errors``: only those that did not err."""
        query = "SELECT variant, suite FROM jobs WHERE run_id = ?" + (" AND status != 'error'" if without_errors else "")
        with closing(self._connect()) as db:
            return set(db.execute(query, (run_id,)).fetchall())

    def discard_if_empty(self, run_id: str) -> None:
        """Remove a run that recorded no job (it failed or was stopped before any finished)."""
        with closing(self._connect()) as db, db:
            if db.execute("SELECT COUNT(*) FROM jobs WHERE run_id = ?", (run_id,)).fetchone()[0] == 0:
                db.execute("DELETE FROM runs WHERE run_id = ?", (run_id,))

    def runs(self) -> pd.DataFrame:
        with closing(self._connect()) as db:
            return pd.read_sql_query("SELECT * FROM runs ORDER BY started, run_id", db)

    def latest_run(self, unfinished: bool = False) -> str | None:
        runs = self.runs()
        if unfinished:
            runs = runs[runs["finished"].isna()]
        return None if runs.empty else str(runs["run_id"].iloc[-1])

    def environment(self, run_id: str) -> dict:
        return self._run_json(run_id, "environment")

    def settings(self, run_id: str) -> dict:
        return self._run_json(run_id, "settings")

    def _run_json(self, run_id: str, column: str) -> dict:
        with closing(self._connect()) as db:
            row = db.execute(f"SELECT {column} FROM runs WHERE run_id = ?", (run_id,)).fetchone()
        return json.loads(row[0]) if row else {}

    def results(self, run_id: str) -> pd.DataFrame:
        with closing(self._connect()) as db:
            present = _columns(db)
            selected = ", ".join(f'"{c}"' if c in present else f'NULL AS "{c}"' for c in RESULT_COLUMNS)
            frame = pd.read_sql_query(f"SELECT {selected} FROM results WHERE run_id = ?", db, params=(run_id,))
        frame["n"] = frame["n"].astype("Int64")
        frame["samples"] = frame["samples"].map(lambda text: json.loads(text) if isinstance(text, str) else None)
        return frame

    def device_kinds(self, run_id: str) -> list[str]:
        """The device kinds a run's jobs ran on: each job's own record (on a Ray cluster, not always the
        machine that started the run), else the run's fingerprint."""
        environment = self.environment(run_id)
        kinds = {device_kind(p.get("ran_on") or environment) for p in self.jobs(run_id).provenance}
        return sorted(kinds) or [device_kind(environment)]

    def jobs(self, run_id: str) -> pd.DataFrame:
        with closing(self._connect()) as db:
            frame = pd.read_sql_query("SELECT * FROM jobs WHERE run_id = ?", db, params=(run_id,))
        frame["provenance"] = frame["provenance"].map(json.loads)
        return frame


def merge(target: Store, source_path: str | Path) -> list[str]:
    """Copy the runs of another results database (another machine's) into ``target``; runs already
    present are left alone; the source is only read. Returns the ids of the runs copied."""
    source = Store(source_path, readonly=True)
    with closing(source._connect()) as other:
        tables = _read_runs(other, list(source.runs().run_id))
    return _add_runs(target, tables)


def export_runs(store: Store, run_ids: Iterable[str], path: Path) -> Path:
    """Write the runs ``run_ids`` (settings, environment, jobs with their provenance, every row) to ``path``
    as JSON lines: the text form of the store committed beside a board, since the SQLite file is not
    committed. :func:`open_store` rebuilds the store from it. Written in a fixed order, so re-rendering the
    same runs writes the same bytes, and through a temporary file, so an interrupted write leaves the old one."""
    with closing(store._connect()) as db:
        tables = _read_runs(db, sorted(run_ids))
    partial = path.with_name(path.name + ".partial")
    with open(partial, "w", encoding="utf-8") as out:
        for table, rows in tables.items():
            for row in rows:
                out.write(json.dumps({"table": table, **row}, sort_keys=True) + "\n")
    os.replace(partial, path)
    return path


def import_runs(target: Store, path: Path) -> list[str]:
    """Add the runs of an :func:`export_runs` file that ``target`` lacks; returns their ids. A line that is
    not a record of this format is refused with its file and line number, before anything is written."""
    tables: dict[str, list[dict]] = {table: [] for table in TABLE_COLUMNS}
    with open(path, encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            try:
                record = json.loads(line)
                table = record.pop("table")
                unknown = set(record) - set(TABLE_COLUMNS[table])
            except (ValueError, AttributeError, KeyError, TypeError) as exc:
                raise StoreError(f"{str(path)!r} line {number}: not a zoo runs export line ({exc!r})") from None
            if unknown or "run_id" not in record:
                raise StoreError(f"{str(path)!r} line {number}: a {table} record with columns "
                                 f"{sorted(unknown) or 'but no run_id'} this zoo does not know")
            tables[table].append(record)
    return _add_runs(target, tables)


def open_store(folder: Path, readonly: bool = False) -> Store:
    """The folder's results database, first given the runs of the folder's committed export
    (:data:`EXPORT`) that it lacks: a fresh checkout has only the export, and a board rendered or a run
    made there would otherwise lose every row it showed from earlier runs. Read-only: an existing database
    is left as it is; a missing one is built from the export."""
    path, export = folder / DATABASE, folder / EXPORT
    if export.is_file() and not (readonly and path.exists()):
        import_runs(Store(path), export)
    return Store(path, readonly=readonly)


TABLE_COLUMNS = {
    "runs": ("run_id", "started", "profile", "settings", "environment", "finished"),
    "jobs": ("run_id", "variant", "suite", "status", "seconds", "provenance"),
    "results": ("run_id", *RESULT_COLUMNS),
}


def _read_runs(db: sqlite3.Connection, run_ids: list[str]) -> dict[str, list[dict]]:
    """The runs' records in each table, in the order they were written (a run's jobs newest last)."""
    present, marks = _columns(db), ",".join("?" * len(run_ids))
    tables = {}
    for table, columns in TABLE_COLUMNS.items():
        select = ", ".join(f'"{c}"' if table != "results" or c in present else f'NULL AS "{c}"' for c in columns)
        rows = db.execute(f"SELECT {select} FROM {table} WHERE run_id IN ({marks}) ORDER BY run_id, rowid", run_ids)
        tables[table] = [dict(zip(columns, row)) for row in rows]
    return tables


def _add_runs(target: Store, tables: dict[str, list[dict]]) -> list[str]:
    """Insert the runs ``target`` lacks, in one transaction that also decides which it lacks (so two
    processes adding the same runs at once cannot both add them)."""
    with closing(target._connect()) as db, db:
        db.execute("BEGIN IMMEDIATE")
        existing = {row[0] for row in db.execute("SELECT run_id FROM runs")}
        new = [r["run_id"] for r in tables["runs"] if r["run_id"] not in existing]
        adding = set(new)
        for table, columns in TABLE_COLUMNS.items():
            names = ", ".join(f'"{c}"' for c in columns)
            db.executemany(f"INSERT INTO {table} ({names}) VALUES ({', '.join('?' * len(columns))})",
                           [tuple(r.get(c) for c in columns) for r in tables[table] if r["run_id"] in adding])
    return new


def device_kind(environment: dict) -> str:
    """What figures are comparable across: the GPU for cuda runs, else the CPU model (``environment``
    is a run's fingerprint or a job's ``ran_on``)."""
    device = environment.get("device", "?")
    return device if device != "cpu" else f"cpu: {environment.get('cpu', '?')}"


_COLUMN_LIST = ", ".join(f'"{c}"' for c in RESULT_COLUMNS)


def _columns(db: sqlite3.Connection, schema: str = "main") -> set[str]:
    return {row[1] for row in db.execute(f"PRAGMA {schema}.table_info(results)")}


def _column(name: str, value):
    """A result field as stored: numbers as REAL, samples as JSON text, text never NULL."""
    if name == "value":
        return _number(value)
    if name == "samples":
        return json.dumps(value) if value else None
    if name == "n":
        return None if value is None else int(value)
    return "" if value is None else str(value)


def _number(value) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None
