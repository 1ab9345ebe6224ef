"""A row says what it is about in typed fields (``versus``: the other callable; ``params``: named values it was
measured at), never in names or setting text read back; rows stored before those fields existed read in today's
kinds, and their export lines stay byte for byte what they were."""

import json
import re
import shutil
import sqlite3
from pathlib import Path

import pytest

import torch

import zoo
from zoo.board import Board
from zoo.checks import Result
from zoo.export import EXPORT, ExportError, check_records, export_bytes, read_export
from zoo.leaderboard import registered_suites
from zoo.store import SCHEMA_VERSION, Store
from zoo.suite import legacy_names, upgrade_name, upgrade_rows

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = ROOT / "leaderboard" / EXPORT


def _store_with(tmp_path, rows) -> tuple[Store, str]:
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run({"name": "smoke"}, {"host": "h"}, "2026-12-01 10:00")
    store.record_job(run, "v", "speed", "done", 0.1, {}, [r.as_dict() for r in rows])
    return store, run


def test_versus_and_params_survive_the_store_and_the_export(tmp_path):
    rows = [Result("time-ratio", "measured", "full fwd n=64", 0.5, "ratio", versus="torch-sdpa", n=64),
            Result("approximation-error-sweep", "measured", "", 0.1, params={"features": 16, "kernel": "relu"}),
            Result("time", "measured", "", 0.01, "s")]
    store, run = _store_with(tmp_path, rows)
    back = store.results(run)
    assert list(back.versus) == ["torch-sdpa", "", ""]
    assert list(back.params) == [None, {"features": 16, "kernel": "relu"}, None]
    record = store.records([run])[run]
    lines = [json.loads(line) for line in record.lines()]
    assert [line.get("versus") for line in lines if line["table"] == "results"] == ["torch-sdpa", None, None]
    (tmp_path / EXPORT).write_text("\n".join(record.lines()) + "\n")
    assert read_export(tmp_path / EXPORT)[run].digest() == record.digest()


def test_a_plugins_numpy_scalar_in_params_is_kept_as_its_number_and_anything_else_as_its_repr(tmp_path):
    import numpy as np

    swept = {"k": np.int64(3), "scale": torch.tensor(0.5), "window": None, "dtype": torch.float16, "big": float("inf")}
    store, run = _store_with(tmp_path, [Result("c", "measured", value=1.0, params=swept)])
    assert store.results(run).params[0] == {"k": 3, "scale": 0.5, "window": "None", "dtype": "torch.float16",
                                            "big": "inf"}
    json.dumps(Result("c", "measured", params=swept).as_dict())  # what a worker sends: plain JSON
    with pytest.raises(ValueError, match="params must be a mapping"):
        Result("c", "measured", params="k=3")


@pytest.mark.parametrize("params, message", [
    ('[1, 2]', "results.params: expected JSON text of an object"),
    ('{"k": [1]}', "results.params: expected values that are numbers, text or booleans, got [1] for 'k'"),
])
def test_an_export_line_with_params_that_are_not_named_scalars_is_refused_by_line(params, message):
    line = {"table": "results", "run_id": "r", "variant": "v", "suite": "s", "check": "c", "status": "measured",
            "setting": "", "value": None, "unit": "", "detail": "", "n": None, "mode": "", "phase": "", "samples": None,
            "params": params}
    with pytest.raises(ExportError, match="^" + re.escape(f"runs.jsonl:3: {message}")):
        check_records([("runs.jsonl:3", line)])


def test_the_committed_runs_written_before_these_fields_are_written_without_them_and_read_in_todays_kinds(tmp_path):
    runs = read_export(COMMITTED)
    written = [json.loads(line) for line in export_bytes(runs.values()).splitlines()]
    committed = [json.loads(line) for line in COMMITTED.read_bytes().splitlines()]
    assert [{k: v for k, v in line.items() if k != "row"} for line in written] == [
        {k: v for k, v in line.items() if k != "row"} for line in committed]  # (its oldest run predates row numbers)
    older = {run_id for run_id, records in runs.items() if "row_form" not in json.loads(records.run["environment"])}
    assert older and not any({"versus", "params", "low", "high"} & set(line) for line in written
                             if line["run_id"] in older)
    store = Store(tmp_path / "results.sqlite")
    store.add(runs.values())
    latest = max(older, key=lambda run_id: runs[run_id].run["started"])
    board = Board.of(store, latest, registered_suites())
    checks = set(board.results.check)
    assert not {c for c in checks if c.startswith(("x-", "baseline-", "memory-vs-")) or c.endswith(("-plan", "-time"))}
    ratios = board.results[board.results.check == "time-ratio"]
    assert {"torch-sdpa", "torch-mha-layer"} <= set(ratios.versus)
    assert board.value("dot-product", "time-ratio", "full", "fwd+bwd", 1024, versus="torch-sdpa") is not None
    sweeps = board.results[board.results.check == "approximation-error-sweep"]
    assert not sweeps.empty and all(set(p) == {"features"} and isinstance(p["features"], int) for p in sweeps.params)
    stored = store.results(latest)  # the store holds them as written: upgraded on reading only
    assert (stored.check.str.startswith("x-")).any() and (stored.versus == "").all()


def test_a_name_is_split_only_when_it_is_no_kind_of_today():
    current = ["crossover-flops", "flops", "time-iqr", "time"]
    assert legacy_names({"check": "crossover-flops", "versus": ""}, {"flops": "{}-flops"}, current)["check"] == "crossover-flops"
    assert legacy_names({"check": "torch-sdpa-flops", "versus": ""}, {"flops": "{}-flops"}, current) == {
        "check": "flops", "versus": "torch-sdpa"}
    assert legacy_names({"check": "tanh-floor-time", "versus": "x"}, {"time": "{}-time"}, current)["check"] == "tanh-floor-time"
    suites = registered_suites()
    assert upgrade_name("x-torch-sdpa", suites) == ("time-ratio", "torch-sdpa")
    assert upgrade_name("memory-vs-naive-broadcast", suites) == ("memory-ratio", "naive-broadcast")
    assert upgrade_name("peak-fraction", suites) == ("peak-fraction", "")


def test_only_the_rows_of_runs_stored_before_are_upgraded_in_order_and_by_their_own_suite():
    import pandas as pd

    def row(run, suite, check, setting=""):
        return {"run_id": run, "suite": suite, "check": check, "versus": "", "setting": setting, "params": None}

    rows = pd.DataFrame([row("old", "speed", "x-torch-sdpa"), row("old", "mine", "x-torch-sdpa"),
                         row("old", "correctness", "baseline-naive"),
                         row("old", "correctness", "device-placement", "batch=2 q_len=9 baseline naive"),
                         row("old", "speed", "approximation-error-sweep", "full fwd n=64 dtype=torch.float16"),
                         row("new", "speed", "compile-time"), row("new", "complexity", "attention-flops"),
                         row("new", "quality", "accuracy-seed", "long-range-copy seed=1"),
                         row("now", "quality", "accuracy-seed", "long-range-copy seed=1")])
    upgraded = upgrade_rows(rows, registered_suites(), {"old": {}, "new": {"row_form": "2"}, "now": {"row_form": "3"}})
    assert list(zip(upgraded.check, upgraded.versus)) == [
        ("time-ratio", "torch-sdpa"), ("x-torch-sdpa", ""), ("baselines", "naive"), ("device-placement", "naive"),
        ("approximation-error-sweep", ""), ("compile-time", ""), ("attention-flops", ""), ("accuracy-seed", ""),
        ("accuracy-seed", "")]
    assert upgraded.params[4] == {"dtype": "torch.float16"}  # no literal: kept as written
    assert upgraded.params[7] == {"task": "long-range-copy", "seed": 1}  # form 2 named the task in the setting only
    assert upgraded.params[8] is None  # a row of today's form is never rewritten


def _as_older_zoo_left_it(store: Store, version: int, *lacking: str) -> Path:
    """A copy of ``store`` beside it as a zoo of schema ``version`` left it: without the ``table.column``s added
    since."""
    old = store.path.with_name("old.sqlite")
    shutil.copy(store.path, old)
    with sqlite3.connect(old) as db:
        for column in lacking:
            table, name = column.split(".")
            db.execute(f"ALTER TABLE {table} DROP COLUMN {name}")
        db.execute(f"PRAGMA user_version = {version}")
    return old


def test_an_older_store_gains_the_new_columns_and_reads_the_same_before_it_does(tmp_path):
    source = Store(tmp_path / "new.sqlite")
    run = source.start_run({"name": "smoke"}, {"host": "h"}, "2026-12-01 10:00")
    source.record_job(run, "v", "speed", "done", 0.1, {}, [Result("x-torch-sdpa", "measured", value=0.5).as_dict()])
    old = _as_older_zoo_left_it(source, 3, "results.versus", "results.params")
    readonly = Store(old, readonly=True).results(run)
    assert list(readonly.versus) == [""] and list(readonly.params) == [None]
    writable = Store(old)
    assert list(writable.results(run).check) == ["x-torch-sdpa"]
    with sqlite3.connect(old) as db:
        assert db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        assert {"versus", "params"} <= {row[1] for row in db.execute("PRAGMA table_info(results)")}
    assert writable.records([run])[run].digest() == source.records([run])[run].digest()


def test_a_run_stored_before_counts_keeps_its_export_lines_and_a_new_one_counts_its_jobs_and_rows(tmp_path):
    source = Store(tmp_path / "new.sqlite")
    run = source.start_run({"name": "smoke"}, {"host": "h"}, "2026-12-01 10:00")
    source.record_job(run, "v", "speed", "done", 0.1, {}, [Result("x-torch-sdpa", "measured", value=0.5).as_dict(),
                                                          Result("time", "measured", value=0.01).as_dict()])
    assert [job["row_count"] for job in source.records([run])[run].jobs] == [2]
    source.record_job(run, "v", "speed", "done", 0.1, {}, [])  # retried: its count is the retry's
    source.record_job(run, "w", "speed", "done", 0.1, {}, [Result("time", "measured", value=0.01).as_dict()])
    lines = source.records([run])[run].lines()
    assert '"job_count": 2' in lines[0] and '"row_count": 0' in lines[1] and '"row_count": 1' in lines[2]
    old = _as_older_zoo_left_it(source, 7, "jobs.row_count", "runs.job_count")
    before = Store(old, readonly=True).records([run])[run]
    assert [job["row_count"] for job in before.jobs] == [None, None] and before.run["job_count"] is None
    assert not any("row_count" in line or "job_count" in line for line in before.lines())
    writable = Store(old)
    assert writable.records([run])[run].lines() == before.lines()  # upgraded: the column added, its lines as they were
    with sqlite3.connect(old) as db:
        assert "row_count" in {row[1] for row in db.execute("PRAGMA table_info(jobs)")}
        assert "job_count" in {row[1] for row in db.execute("PRAGMA table_info(runs)")}


def test_a_new_run_records_that_its_rows_are_typed_so_none_of_them_is_ever_renamed():
    from zoo.checks import ROW_FORM
    from zoo.environment import fingerprint
    from zoo.profiles import get_profile

    assert fingerprint(get_profile("smoke"), "cpu")["row_form"] == ROW_FORM


def test_a_row_of_a_kind_its_suite_does_not_declare_is_an_error_naming_it():
    """The board reads a suite's rows by their declared kinds (its measures, its checks' names): a check that
    yields another kind, in a process or combined over the run's processes, gets an error row saying which (the
    row is kept, but no section would ever show it)."""
    from zoo import Check, Measure, Result, Suite
    from zoo.checks import run_check
    from zoo.profiles import get_profile
    from zoo.registry import Registry
    from zoo.runner import combine_processes

    from conftest import minimal_variant

    suite = Suite("mine", "a suite", measures=(Measure("gain", "what it measures", "ratio"),))
    check = Check("probe", "mine", "probes", lambda variant, profile: iter([
        Result("gain", "measured", value=1.0), Result("gian", "measured", value=2.0), Result("probe", "passed")]),
        combine=lambda variant, profile, per_process: [Result("gain", "measured", value=1.0),
                                                       Result("gains", "measured", value=1.0)])
    kinds = suite.row_kinds([check])
    assert kinds == {"gain", "probe"} and Suite("bare", "declares nothing").row_kinds([check]) is None
    rows = run_check(check, minimal_variant(), None, kinds=kinds)
    assert [(r.check, r.status) for r in rows] == [("gain", "measured"), ("gian", "measured"), ("probe", "passed"),
                                                    ("probe", "error")]
    assert "yielded rows of kind 'gian', which its suite 'mine' does not declare" in rows[-1].detail
    assert run_check(check, minimal_variant(), None)[-1].status == "passed"  # nothing to hold it to
    odd = Check("odd", "mine", "a kind that is no name", lambda variant, profile: iter([Result(["gain"], "measured")]))
    assert "yielded rows of kind ['gain']" in run_check(odd, minimal_variant(), None, kinds=kinds)[-1].detail

    class Plugin:
        @staticmethod
        def zoo_register_suites(register):
            register(suite)

        @staticmethod
        def zoo_register_checks(register):
            register(check)

        @staticmethod
        def zoo_register_variants(register):
            register(minimal_variant())

    registry = Registry()
    registry.add_plugin(Plugin, zoo.Origin("mine", "module", "tests"))
    name = minimal_variant().name
    records = [{"variant": name, "suite": "mine", "checks": [("probe", [r.as_dict() for r in rows[:3]])]}] * 2
    combined = combine_processes(registry, get_profile("smoke"), records)
    assert [(r["check"], r["status"]) for r in combined] == [("gain", "measured"), ("gains", "measured"),
                                                              ("probe", "error")]
    assert "yielded rows of kind 'gains'" in combined[-1]["detail"]


def test_every_row_a_real_run_stores_is_of_a_kind_its_suite_declares(smoke_run):
    from zoo.api import default_registry

    store, run_id = smoke_run
    registry = default_registry()
    rows = store.results(run_id)
    undeclared = {(suite, check) for suite, check in zip(rows.suite, rows.check)
                  if check not in registry.suite(suite).row_kinds(registry.checks_for(suite))}
    assert undeclared == set() and set(rows.suite) >= {"correctness", "complexity", "speed", "inference"}
