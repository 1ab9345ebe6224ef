"""``runs.jsonl``: a board's runs as text, committed beside the board in place of the SQLite store.

One JSON object per line: ``table`` names its table (runs, jobs or results), the other keys are that table's
columns, all of them, and a result line also carries ``row``, its place among its job's rows, while a jobs line
says how many rows its job recorded (``row_count``) and a runs line how many jobs its run recorded
(``job_count``), so a duplicated or a missing line is seen, the last of a job's and a whole job too where the
run counted them (runs stored before they were counted have no counts: see :data:`OPTIONAL`). A run's lines
are contiguous (its ``runs`` line, its jobs, its rows) and runs are sorted by id, so the same runs always give
the same bytes and a new run is one block in a diff.

Reading checks every line against :data:`SCHEMA` and the file as a whole (no run, job or row twice, none
missing, no job or row of a run the file does not hold) before anything is written anywhere; a bad line is
refused as ``file:line: what is wrong``. The same check runs on a database's rows before they are merged or
exported, and on every row a check yields before it is stored (:func:`storable`), so a value of the wrong type
never enters a store, and nothing the zoo writes is refused when it is read back.
"""

from __future__ import annotations

import hashlib
import json
import math
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from .checks import ERROR, RESULT_FIELDS, STATUSES
from .contract import ZooError

EXPORT = "runs.jsonl"
DATABASE = "results.sqlite"
"""A board folder's two stores of runs: the committed export and the local database (named here, where nothing
heavy is imported, so the CLI's help can name them)."""
JOB_STATUSES = ("done", "error")
ROW = "row"  # a result line's place among its job's rows (not a stored column: the order is)


class ExportError(ZooError):
    """A runs export (or a database being merged) holds something that is not a zoo run: one line says where."""


Kind = Callable[[object], "str | None"]
"""A column's type: returns what is wrong with a value, or None when it fits."""


def _text(value) -> str | None:
    if not isinstance(value, str):
        return f"expected text, got {_shown(value)}"
    if value.isascii():  # most of an export, and Unicode text by construction
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return "expected text, got a string with a lone surrogate (not Unicode text)"
    return None


def _name(value) -> str | None:
    return _text(value) or (None if value.strip() else "expected a non-empty name, got an empty string")


def _optional_text(value) -> str | None:
    return None if value is None else _text(value)


def _is_number(value) -> bool:
    return isinstance(value, float) or (isinstance(value, int) and not isinstance(value, bool) and abs(value) <= 2 ** 1023)


def _optional_number(value) -> str | None:
    """A REAL column: finite, or null (SQLite stores NaN as null, so NaN reads as null; an infinity is no figure)."""
    if value is None or (_is_number(value) and not math.isinf(value)):
        return None
    return f"expected a finite number or null, got {_shown(value)}"


def _optional_integer(value) -> str | None:
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and abs(value) < 2 ** 63):
        return None
    return f"expected an integer (64-bit) or null, got {_shown(value)}"


def _optional_count(value) -> str | None:
    """A length, a batch size: an integer, not negative (0 is an empty sequence or batch), or null."""
    problem = _optional_integer(value)
    return problem or (f"expected an integer of 0 or more or null, got {_shown(value)}" if value is not None and
                       value < 0 else None)


def _optional_duration(value) -> str | None:
    """A job's seconds: finite and not negative, or null."""
    problem = _optional_number(value)
    return problem or (f"expected a duration of 0 s or more or null, got {_shown(value)}" if value is not None and
                       value < 0 else None)


def _one_of(choices: tuple[str, ...]) -> Kind:
    def check(value) -> str | None:
        return None if value in choices else f"expected one of {', '.join(choices)}, got {_shown(value)}"

    return check


def _json_object(value) -> str | None:
    """A column stored as JSON text of an object (settings, environment, provenance)."""
    return _parsed_object(value)[1]


def _parsed_object(value) -> tuple[dict | None, str | None]:
    """``value`` as the JSON object its text holds, or what is wrong with it."""
    if _text(value):
        return None, f"expected JSON text of an object, got {_shown(value)}"
    parsed, problem = _parse(value)
    if problem:
        return None, f"expected JSON text of an object, got text that is not JSON ({problem})"
    return (parsed, None) if isinstance(parsed, dict) else (
        None, f"expected JSON text of an object, got JSON {type(parsed).__name__}")


def _settings(value) -> str | None:
    """A run's settings (:meth:`zoo.profiles.Profile.as_dict` as JSON text): an object whose run-wide settings have
    their types and whose ``suites`` maps each suite to an object of its settings, each of a registered suite in the
    shape of its default (a list where it is a list, a number where a number, ...)."""
    parsed, problem = _parsed_object(value)
    if problem:
        return problem
    for key, check in RUN_SETTINGS.items():
        if key in parsed and (problem := check(parsed[key])):
            return f"{key}: {problem}"
    suites = parsed.get("suites")
    if suites is None:
        return None  # stored before settings were nested under their suites: read through the suites' legacy names
    if not isinstance(suites, dict) or not all(isinstance(v, dict) for v in suites.values()):
        return f"suites: expected an object of each suite's object of settings, got {_shown(suites)}"
    from .api import default_registry  # the suites installed here: only theirs can be typed

    registered = default_registry().suites
    for suite, settings in suites.items():
        defaults = registered[suite].settings if suite in registered else {}
        for key, item in settings.items():
            problem = _like(defaults.get(key), item)
            if problem:
                return f"{suite}.{key}: {problem}"
    return None


def _like(default, value) -> str | None:
    """What is wrong with a stored setting ``value`` whose default is ``default`` (null is always stored)."""
    if value is None or default is None:
        return None
    if isinstance(default, bool):
        return _flag(value)
    if isinstance(default, (int, float)):
        return None if _is_number(value) else f"expected a number, got {_shown(value)}"
    if isinstance(default, str):
        return _text(value)
    if isinstance(default, (tuple, list)):
        return None if isinstance(value, list) else f"expected a list, got {_shown(value)}"
    if isinstance(default, dict):
        return _object(value)
    return None


def _integer(value) -> str | None:
    return _optional_integer(value) if value is not None else "expected an integer, got null"


def _object(value) -> str | None:
    return None if isinstance(value, dict) else f"expected an object, got {_shown(value)}"


def _list_of(check: Kind) -> Kind:
    def checked(value) -> str | None:
        if not isinstance(value, list):
            return f"expected a list, got {_shown(value)}"
        return next((f"item {i}: {check(item)}" for i, item in enumerate(value) if check(item)), None)

    return checked


def _object_of(check: Kind) -> Kind:
    def checked(value) -> str | None:
        if not isinstance(value, dict):
            return f"expected an object, got {_shown(value)}"
        return next((f"{key}: {check(item)}" for key, item in value.items() if check(item)), None)

    return checked


def _flag(value) -> str | None:
    return None if isinstance(value, bool) else f"expected true or false, got {_shown(value)}"


def _card_number(value) -> str | None:
    return None if value is None or _is_number(value) else f"expected a number or null, got {_shown(value)}"


RUN_SETTINGS: dict[str, Kind] = {
    "name": _text, "seed": _integer, "device": _text, "threads": _integer, "dtype": _text,
    "variant_timeout_seconds": _optional_number, "processes": _integer, "variant_options": _object,
}
"""The run-wide settings a run stores beside its suites', and their types."""
CARD: dict[str, Kind] = {
    "summary": _optional_text, "family": _optional_text, "citation": _optional_text, "kind": _optional_text,
    "tags": _object_of(_flag), "approximates": _optional_text, "claimed_time": _card_number,
    "claimed_memory": _card_number, "options": _object_of(_text), "quality_options": _object_of(_text),
    "baselines": _list_of(_text), "floors": _list_of(_text), "peers": _list_of(_text), "best_known": _optional_text,
    "targets": _list_of(_object), "decoder_growth": _optional_text, "decoder_absent": _optional_text,
    "decoder_context": _flag, "departures": _list_of(_object_of(_optional_text)), "random_features": _flag,
}
"""The fields of a variant's card (:meth:`zoo.Variant.card`) a board reads, and their types; a card stored before a
field existed lacks it."""


def _provenance(value) -> str | None:
    """A job's provenance: an object whose ``card``, where it has one, is an object of the card's fields."""
    parsed, problem = _parsed_object(value)
    if problem:
        return problem
    if "card" not in parsed:
        return None
    card = parsed["card"]
    if not isinstance(card, dict):
        return f"card: expected an object, got {_shown(card)}"
    return next((f"card.{key}: {problem}" for key, check in CARD.items()
                 if key in card and (problem := check(card[key]))), None)


def _optional_json_numbers(value) -> str | None:
    """Per-round samples: JSON text of a list of finite numbers, or null."""
    if value is None:
        return None
    if _text(value):
        return f"expected JSON text of a list of numbers or null, got {_shown(value)}"
    parsed, problem = _parse(value)
    if problem:
        return f"expected JSON text of a list of numbers, got text that is not JSON ({problem})"
    if not isinstance(parsed, list) or not all(_is_number(x) and math.isfinite(x) for x in parsed):
        return f"expected JSON text of a list of finite numbers, got {_shown(parsed)}"
    return None


def _optional_params(value) -> str | None:
    """A row's named parameters: JSON text of an object of names to numbers, text or booleans, or null."""
    if value is None:
        return None
    parsed, problem = _parsed_object(value)
    if problem:
        return problem
    bad = [key for key, item in parsed.items() if not (isinstance(item, (str, bool)) or
                                                        (_is_number(item) and math.isfinite(item)))]
    return f"expected values that are numbers, text or booleans, got {_shown(parsed[bad[0]])} for {bad[0]!r}" if bad else None


def _parse(text: str):
    try:
        return json.loads(text), None
    except ValueError as exc:
        return None, str(exc)
    except RecursionError:
        return None, "nested too deeply"


_RESULT_KINDS: dict[str, Kind] = {
    "check": _name, "status": _one_of(STATUSES), "setting": _text, "value": _optional_number, "unit": _text,
    "detail": _text, "n": _optional_count, "mode": _text, "phase": _text, "samples": _optional_json_numbers,
    "versus": _text, "params": _optional_params, "low": _optional_number, "high": _optional_number,
    "batch": _optional_count,
}
OPTIONAL = {("results", "versus"): "", ("results", "params"): None, ("results", "low"): None, ("results", "high"): None,
            ("results", "batch"): None, ("jobs", "row_count"): None, ("runs", "job_count"): None}
"""Columns added since exports were first written, with the value a line without them has: a line leaves them out
at that value, so a run stored before they existed keeps its lines (and its digest) as they were (a job or run
recorded before ``row_count`` and ``job_count`` existed has none, and what it holds is not counted)."""
SCHEMA: dict[str, dict[str, Kind]] = {
    "runs": {"run_id": _name, "started": _name, "profile": _name, "settings": _settings,
             "environment": _json_object, "finished": _optional_text, "job_count": _optional_count},
    "jobs": {"run_id": _name, "variant": _name, "suite": _name, "status": _one_of(JOB_STATUSES),
             "seconds": _optional_duration, "provenance": _provenance, "row_count": _optional_count},
    "results": {"run_id": _name, "variant": _name, "suite": _name, **{f: _RESULT_KINDS[f] for f in RESULT_FIELDS}},
}
"""The one schema of a stored run: each table's columns and their types (the store's tables have these columns)."""
TABLE_COLUMNS = {table: tuple(columns) for table, columns in SCHEMA.items()}
_DEFAULTS = {table: {column: default for (kind, column), default in OPTIONAL.items() if kind == table}
             for table in SCHEMA}


@dataclass
class RunRecords:
    """One run as stored: its ``runs`` record, its jobs and its result rows, each a dict of its table's columns,
    in the order they were written."""

    run: dict
    jobs: list[dict] = field(default_factory=list)
    results: list[dict] = field(default_factory=list)
    read_at: tuple[int, int, str] | None = field(default=None, compare=False, repr=False)
    """Where the export it was read from holds its lines: (start, length in bytes, their sha256); None when it was
    not read from one or its lines there are not contiguous. Those bytes are its own lines as :meth:`lines` writes
    them only where that sha256 is :meth:`digest`."""

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.run["run_id"]

    def lines(self) -> list[str]:
        """The run's export lines: canonical JSON, keys sorted, each result with its place in its job."""
        places: dict[tuple[str, str], int] = {}
        rows = []
        for record in self.results:
            key = (record["variant"], record["suite"])
            rows.append({**record, ROW: places.setdefault(key, 0)})
            places[key] += 1
        return [json.dumps({"table": table, **_without_defaults(table, record)}, sort_keys=True)
                for table, records in (("runs", [self.run]), ("jobs", self.jobs), ("results", rows))
                for record in records]

    def digest(self) -> str:
        """What identifies the run's content: two copies of a run are the same run when their digests are equal."""
        return hashlib.sha256("\n".join(self.lines()).encode()).hexdigest()

    def describe(self) -> str:
        """'N jobs, M rows', for messages."""
        return f"{len(self.jobs)} jobs, {len(self.results)} rows"


def _without_defaults(table: str, record: dict) -> dict:
    return {k: v for k, v in record.items() if (table, k) not in OPTIONAL or v != OPTIONAL[(table, k)]}


def export_bytes(runs: Iterable[RunRecords]) -> bytes:
    """The export file holding ``runs`` (sorted by id); a run with no job yet (one starting, or one that failed
    before any job finished and is being discarded) carries nothing and is left out."""
    return export_with_digests(runs)[0]


def export_with_digests(runs: Iterable[RunRecords]) -> tuple[bytes, dict[str, str]]:
    """The export file holding ``runs`` (:func:`export_bytes`) and the digest of each run it holds, from one
    serialisation of each (serialising a board's runs took seconds)."""
    data, digests, _ = export_with_spans(runs)
    return data, digests


def export_with_spans(runs: Iterable[RunRecords], kept: dict[str, bytes] | None = None,
                      ) -> tuple[bytes, dict[str, str], dict[str, tuple[int, int]]]:
    """The export file holding ``runs`` and the runs in ``kept`` (id -> the run's lines as an export held them,
    without the last newline: copied as they are, not serialised again; a run in both is taken from ``kept``), the
    digest of each run it holds and where it holds it (start, length in bytes)."""
    texts = {run.run_id: "\n".join(run.lines()).encode() for run in runs if run.jobs and run.run_id not in (kept or {})}
    texts.update(kept or {})
    parts, spans, start = [], {}, 0
    for run_id in sorted(texts):
        spans[run_id] = (start, len(texts[run_id]))
        parts += [texts[run_id], b"\n"]
        start += len(texts[run_id]) + 1
    return b"".join(parts), {run_id: hashlib.sha256(text).hexdigest() for run_id, text in texts.items()}, spans


def read_export(path: Path) -> dict[str, RunRecords]:
    """The runs of an export file by id, every line checked; :class:`ExportError` names the first bad one."""
    return parse_export(export_file_bytes(path), Path(path))


def export_file_bytes(path: Path) -> bytes:
    """An export file's bytes; one that is not a regular file (a pipe would block) or cannot be read is refused."""
    path = Path(path)
    try:
        if not stat.S_ISREG(path.stat().st_mode):
            raise ExportError(f"{path}: not a regular file")
        return path.read_bytes()
    except OSError as exc:
        raise ExportError(f"{path}: cannot read it ({exc.strerror or exc})") from None


def parse_export(data: bytes, path: Path) -> dict[str, RunRecords]:
    """The runs of an export file's bytes (``path``: where they were read, for messages), every line checked."""
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    records = []
    starts, start = [], 0  # each line's first byte
    for raw in lines:
        starts.append(start)
        start += len(raw) + 1
    for number, raw in enumerate(lines, 1):
        where = f"{path}:{number}"
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise ExportError(f"{where}: not UTF-8 text (byte 0x{raw[exc.start]:02x} at column {exc.start + 1})") from None
        record, problem = _parse(text)
        if problem:
            raise ExportError(f"{where}: not a JSON line ({problem})")
        records.append((where, record))
    runs = check_records(records, numbered=True)
    first: dict[str, int] = {}
    count: dict[str, int] = {}
    for index, (_, record) in enumerate(records):
        first.setdefault(record["run_id"], index)
        count[record["run_id"]] = count.get(record["run_id"], 0) + 1
    for run_id, run in runs.items():
        last = first[run_id] + count[run_id] - 1
        if records[last][1]["run_id"] == run_id:  # its lines contiguous
            block = data[starts[first[run_id]]:starts[last] + len(lines[last])]
            run.read_at = (starts[first[run_id]], len(block), hashlib.sha256(block).hexdigest())
    return runs


def check_records(records: Iterable[tuple[str, object]], numbered: bool = False) -> dict[str, RunRecords]:
    """Check ``(where, record)`` pairs, each a dict with ``table`` and every column of that table, as a whole;
    return the runs by id. ``numbered``: result records carry their ``row`` (an export's lines; an export
    written before rows were numbered is read in its order)."""
    runs: dict[str, RunRecords] = {}
    run_lines: dict[str, str] = {}
    jobs: dict[tuple, tuple[str, dict]] = {}
    pending: list[tuple[str, str, dict, object]] = []
    verdicts: dict[tuple, str | None] = {}  # a repeated text's verdict, once per kind
    for where, record in records:
        table, values, place = _check_record(where, record, numbered, verdicts)
        if table == "runs":
            if values["run_id"] in runs:
                raise ExportError(f"{where}: run {values['run_id']!r} appears twice (a duplicated line or a bad merge)")
            runs[values["run_id"]] = RunRecords(values)
            run_lines[values["run_id"]] = where
        else:
            pending.append((where, table, values, place))
    for where, table, values, _ in pending:
        run = runs.get(values["run_id"])
        if run is None:
            raise ExportError(f"{where}: a {table} record of run {values['run_id']!r}, which has no runs line")
        key = (values["run_id"], values["variant"], values["suite"])
        if table == "jobs":
            if key in jobs:
                raise ExportError(f"{where}: job {key[1]}/{key[2]} of run {key[0]!r} appears twice "
                                  f"(also at {jobs[key][0]})")
            jobs[key] = where, values
            run.jobs.append(values)
    seen: dict[tuple, list[str]] = {}
    for where, table, values, place in pending:
        if table != "results":
            continue
        key = (values["run_id"], values["variant"], values["suite"])
        if key not in jobs:
            raise ExportError(f"{where}: a result row of job {key[1]}/{key[2]} of run {key[0]!r}, which has no jobs line")
        earlier = seen.setdefault(key, [])
        if place is not None and place != len(earlier):
            what = f"appears twice (also at {earlier[place]})" if place < len(earlier) else \
                f"follows row {len(earlier) - 1}: a line is missing" if earlier else "comes first: a line is missing"
            raise ExportError(f"{where}: row {place} of job {key[1]}/{key[2]} of run {key[0]!r} {what}")
        earlier.append(where)
        runs[key[0]].results.append(values)
    for run in runs.values():
        if run.run["job_count"] is not None and len(run.jobs) != run.run["job_count"]:
            count, recorded = len(run.jobs), run.run["job_count"]
            raise ExportError(f"{run_lines[run.run_id]}: run {run.run_id!r} recorded {recorded} "
                              f"job{'s' if recorded != 1 else ''}, {count} {'are' if count != 1 else 'is'} here: "
                              f"{'a job is missing' if count < recorded else 'a job was added'}")
    for key, (where, job) in jobs.items():
        count, recorded = len(seen.get(key, ())), job["row_count"]
        if recorded is not None and count != recorded:
            raise ExportError(f"{where}: job {key[1]}/{key[2]} of run {key[0]!r} recorded {recorded} "
                              f"row{'s' if recorded != 1 else ''}, "
                              f"{count} {'are' if count != 1 else 'is'} here: "
                              f"{'a row is missing' if count < recorded else 'a row was added'}")
    return runs


def _check_record(where: str, record, numbered: bool, verdicts: dict) -> tuple[str, dict, object]:
    """One record's table, its values (every column, numbers as SQLite's REAL gives them) and its place. A text
    value's verdict is looked up in ``verdicts`` first: names, settings and parameters repeat over a file's lines,
    and checking each afresh was most of the time a board took to open."""
    if not isinstance(record, dict):
        raise ExportError(f"{where}: expected a JSON object, got {_shown(record)}")
    table = record.get("table")
    if table not in SCHEMA:
        raise ExportError(f"{where}: 'table' must be one of {', '.join(SCHEMA)}, got {_shown(table)}")
    columns = SCHEMA[table]
    place = record.get(ROW) if table == "results" and numbered else None
    if place is not None and _optional_integer(place):
        raise ExportError(f"{where}: results.{ROW}: {_optional_integer(place)}")
    known = {"table", ROW} if table == "results" and numbered else {"table"}
    unknown = [k for k in record if k not in columns and k not in known]
    if unknown:
        raise ExportError(f"{where}: a {table} record with columns this zoo does not know: {', '.join(sorted(unknown))}")
    defaults = _DEFAULTS[table]
    values = {}
    for column, kind in columns.items():
        if column in record:
            value = record[column]
        elif column in defaults:
            value = defaults[column]
        else:
            missing = [c for c in columns if c not in record and c not in defaults]
            raise ExportError(f"{where}: a {table} record without {', '.join(missing)}")
        if type(value) is str and kind not in _UNCACHED:
            problem = verdicts.get((kind, value), _UNSEEN)
            if problem is _UNSEEN:
                problem = verdicts[(kind, value)] = kind(value)
        else:
            problem = kind(value)
        if problem:
            raise ExportError(f"{where}: {table}.{column}: {problem}")
        if value is not None and kind in _REAL:  # as SQLite's REAL gives it
            value = float(value)
            if math.isnan(value):
                value = None
        values[column] = value
    return table, values, place


_UNSEEN = object()
_REAL = (_optional_number, _optional_duration)
_UNCACHED = (_optional_json_numbers,)  # per-round samples: nearly every line's its own


def storable(rows: Iterable[dict], check: str = "") -> list[dict]:
    """A check's rows as the store keeps them (samples as JSON text), each one that the export reads back: numbers
    of any numeric type as floats, a NaN value as null (as SQLite keeps it), text fields as text; a row that
    still breaks the schema (a plugin's bug: an empty check name, text that is not Unicode, an infinite value,
    an integer beyond 64 bits) becomes an error row saying what was wrong with it (``check``: its name then)."""
    kept = []
    for row in rows:
        values = _normalized(row)
        problems = [f"{column}: {problem}" for column, kind in _RESULT_KINDS.items()
                    if (problem := _kind_problem(kind, values[column]))]
        if problems:
            name = values["check"] if not _kind_problem(_name, values["check"]) else (check or "invalid-row")
            values = {**{name: "" for name in ("setting", "unit", "mode", "phase", "versus")},
                      **{name: None for name in ("value", "n", "samples", "params", "low", "high", "batch")}, "check": name,
                      "status": ERROR,
                      "detail": "the check yielded a row the store cannot keep: " + "; ".join(problems)[:500]}
        kept.append(values)
    return kept


def _normalized(row: dict) -> dict:
    values = {name: row.get(name) for name in RESULT_FIELDS}
    for name in ("setting", "unit", "detail", "mode", "phase", "versus"):
        if values[name] is None:
            values[name] = ""
        elif not isinstance(values[name], str):
            values[name] = str(values[name])
    for name in ("value", "low", "high"):
        if values[name] is not None and not isinstance(values[name], (bool, str)):
            try:
                values[name] = float(values[name])
            except (TypeError, ValueError, OverflowError):
                pass
            if isinstance(values[name], float) and math.isnan(values[name]):
                values[name] = None
    for name in ("n", "batch"):
        if isinstance(values[name], float) and values[name].is_integer():
            values[name] = int(values[name])
        elif values[name] is not None and not isinstance(values[name], (bool, int)) and hasattr(values[name], "__index__"):
            values[name] = values[name].__index__()
    samples = values["samples"]
    if samples is not None and not isinstance(samples, str):
        try:
            values["samples"] = json.dumps([float(x) for x in samples], allow_nan=True) if len(samples) else None
        except (TypeError, ValueError, OverflowError):
            values["samples"] = repr(samples)
    params = values["params"]
    if params is not None and not isinstance(params, str):
        try:
            values["params"] = json.dumps(params, sort_keys=True, allow_nan=True) if params else None
        except (TypeError, ValueError, OverflowError):
            values["params"] = repr(params)
    return values


def _kind_problem(kind: Kind, value) -> str | None:
    try:
        return kind(value)
    except Exception as exc:  # a value no kind foresaw (an object of a plugin's own type)
        return f"{type(exc).__name__}: {exc}"


def _shown(value) -> str:
    """A value as the user wrote it, short."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
