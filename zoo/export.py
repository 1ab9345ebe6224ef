"""``runs.jsonl``: a board's runs as text, committed beside the board in place of the SQLite store.

One JSON object per line: ``table`` names its table (runs, jobs or results), the other keys are that table's
columns, all of them. A run's lines are contiguous (its ``runs`` line, its jobs, its rows) and runs are sorted
by id, so the same runs always give the same bytes and a new run is one block in a diff.

Reading checks every line against :data:`SCHEMA` and the file as a whole (no run twice, no job twice, no job
or row of a run the file does not hold) before anything is written anywhere; a bad line is refused as
``file:line: what is wrong``. The same check runs on what another machine's database holds before it is
merged, so a value of the wrong type never enters a store.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from .checks import RESULT_FIELDS, STATUSES
from .contract import ZooError

EXPORT = "runs.jsonl"
JOB_STATUSES = ("done", "error")


class ExportError(ZooError):
    """A runs export (or a database being merged) holds something that is not a zoo run: one line says where."""


Kind = Callable[[object], "str | None"]
"""A column's type: returns what is wrong with a value, or None when it fits."""


def _text(value) -> str | None:
    return None if isinstance(value, str) else f"expected text, got {_shown(value)}"


def _name(value) -> str | None:
    return _text(value) or (None if value.strip() else "expected a non-empty name, got an empty string")


def _optional_text(value) -> str | None:
    return None if value is None else _text(value)


def _optional_number(value) -> str | None:
    """A REAL column: SQLite gives integers back as floats and stores NaN as null, so both are read that way."""
    if value is None or isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool)
                                                     and abs(value) <= 2 ** 1023):
        return None
    return f"expected a number or null, got {_shown(value)}"


def _optional_integer(value) -> str | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2 ** 63):
        return None
    return f"expected an integer (64-bit) or null, got {_shown(value)}"


def _one_of(choices: tuple[str, ...]) -> Kind:
    def check(value) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}, got {_shown(value)}"

    return check


def _json_object(value) -> str | None:
    """A column stored as JSON text of an object (settings, environment, provenance)."""
    if not isinstance(value, str):
        return f"expected JSON text of an object, got {_shown(value)}"
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"expected JSON text of an object, got text that is not JSON ({exc})"
    return None if isinstance(parsed, dict) else f"expected JSON text of an object, got JSON {type(parsed).__name__}"


def _optional_json_numbers(value) -> str | None:
    """Per-round samples: JSON text of a list of numbers, or null."""
    if value is None:
        return None
    if not isinstance(value, str):
        return f"expected JSON text of a list of numbers or null, got {_shown(value)}"
    try:
        parsed = json.loads(value)
    except ValueError as exc:
        return f"expected JSON text of a list of numbers, got text that is not JSON ({exc})"
    if not isinstance(parsed, list) or any(_optional_number(x) or x is None for x in parsed):
        return f"expected JSON text of a list of numbers, got {_shown(parsed)}"
    return None


_RESULT_KINDS: dict[str, Kind] = {
    "check": _name, "status": _one_of(STATUSES), "setting": _text, "value": _optional_number, "unit": _text,
    "detail": _text, "n": _optional_integer, "mode": _text, "phase": _text, "samples": _optional_json_numbers,
}
SCHEMA: dict[str, dict[str, Kind]] = {
    "runs": {"run_id": _name, "started": _name, "profile": _name, "settings": _json_object,
             "environment": _json_object, "finished": _optional_text},
    "jobs": {"run_id": _name, "variant": _name, "suite": _name, "status": _one_of(JOB_STATUSES),
             "seconds": _optional_number, "provenance": _json_object},
    "results": {"run_id": _name, "variant": _name, "suite": _name, **{f: _RESULT_KINDS[f] for f in RESULT_FIELDS}},
}
"""The one schema of a stored run: each table's columns and their types (the store's tables have these columns)."""
TABLE_COLUMNS = {table: tuple(columns) for table, columns in SCHEMA.items()}


@dataclass
class RunRecords:
    """One run as stored: its ``runs`` record, its jobs and its result rows, each a dict of its table's columns,
    in the order they were written."""

    run: dict
    jobs: list[dict] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)

    @property
    def run_id(self) -> str:
        return self.run["run_id"]

    def lines(self) -> list[str]:
        """The run's export lines: canonical JSON, keys sorted."""
        return [json.dumps({"table": table, **record}, sort_keys=True)
                for table, records in (("runs", [self.run]), ("jobs", self.jobs), ("results", self.results))
                for record in records]

    def digest(self) -> str:
        """What identifies the run's content: two copies of a run are the same run when their digests are equal."""
        return hashlib.sha256("\n".join(self.lines()).encode()).hexdigest()

    def describe(self) -> str:
        return f"{len(self.jobs)} jobs, {len(self.results)} rows"


def export_bytes(runs: Iterable[RunRecords]) -> bytes:
    """The export file holding ``runs`` (sorted by id)."""
    ordered = sorted(runs, key=lambda r: r.run_id)
    return "".join(line + "\n" for run in ordered for line in run.lines()).encode()


def read_export(path: Path) -> dict[str, RunRecords]:
    """The runs of an export file by id, every line checked; :class:`ExportError` names the first bad one."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ExportError(f"{path}: cannot read it ({exc.strerror or exc})") from None
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    records = []
    for number, raw in enumerate(lines, 1):
        where = f"{path}:{number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExportError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})") from None
        try:
            record = json.loads(text)
        except ValueError as exc:
            raise ExportError(f"{where}: not a JSON line ({exc})") from None
        records.append((where, record))
    return check_records(records)


def check_records(records: Iterable[tuple[str, object]]) -> dict[str, RunRecords]:
    """Check ``(where, record)`` pairs, each a dict with ``table`` and every column of that table, as a whole;
    return the runs by id."""
    runs: dict[str, RunRecords] = {}
    jobs: dict[tuple, str] = {}
    pending: list[tuple[str, str, dict]] = []
    for where, record in records:
        table, values = _check_record(where, record)
        if table == "runs":
            if values["run_id"] in runs:
                raise ExportError(f"{where}: run {values['run_id']!r} appears twice (a duplicated line or a bad merge)")
            runs[values["run_id"]] = RunRecords(values)
        else:
            pending.append((where, table, values))
    for where, table, values in pending:
        run = runs.get(values["run_id"])
        if run is None:
            raise ExportError(f"{where}: a {table} record of run {values['run_id']!r}, which has no runs line")
        key = (values["run_id"], values["variant"], values["suite"])
        if table == "jobs":
            if key in jobs:
                raise ExportError(f"{where}: job {key[1]}/{key[2]} of run {key[0]!r} appears twice (also at {jobs[key]})")
            jobs[key] = where
            run.jobs.append(values)
    for where, table, values in pending:
        if table == "results":
            key = (values["run_id"], values["variant"], values["suite"])
            if key not in jobs:
                raise ExportError(f"{where}: a result row of job {key[1]}/{key[2]} of run {key[0]!r}, "
                                  "which has no jobs line")
            runs[key[0]].results.append(values)
    return runs


def _check_record(where: str, record) -> tuple[str, dict]:
    if not isinstance(record, dict):
        raise ExportError(f"{where}: expected a JSON object, got {_shown(record)}")
    table = record.get("table")
    if table not in SCHEMA:
        raise ExportError(f"{where}: 'table' must be one of {', '.join(SCHEMA)}, got {_shown(table)}")
    columns = SCHEMA[table]
    values = {k: v for k, v in record.items() if k != "table"}
    unknown, missing = sorted(set(values) - set(columns)), [c for c in columns if c not in values]
    if unknown:
        raise ExportError(f"{where}: a {table} record with columns this zoo does not know: {', '.join(unknown)}")
    if missing:
        raise ExportError(f"{where}: a {table} record without {', '.join(missing)}")
    for column, kind in columns.items():
        problem = kind(values[column])
        if problem:
            raise ExportError(f"{where}: {table}.{column}: {problem}")
        if kind is _optional_number and values[column] is not None:  # as SQLite's REAL column gives it back
            number = float(values[column])
            values[column] = None if math.isnan(number) else number
    return table, {c: values[c] for c in columns}


def _shown(value) -> str:
    """A value as the user wrote it, short."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    text = json.dumps(value) if not isinstance(value, (set, bytes)) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
