"""Nothing lost: a board folder's kept runs survive every command, every bad file, a full disk and a kill.

The rules under test (zoo/folder.py): every command joins the database and the committed export first; only
commands that add runs write the export, and it then holds every run of both; the board's files are published as
a whole; a damaged store or a bad export line is refused in one line and nothing on disk changes.
"""

import contextlib
import errno
import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

import zoo
from conftest import run_zoo, zoo_here
from zoo.export import read_export
from zoo.folder import BoardFolder, FolderError
from zoo.leaderboard import render
from zoo.store import Store, StoreError

REPO = Path(__file__).resolve().parent.parent
BOARD_FILES = ("README.md", "index.html", "results.csv", "runs.jsonl")


def fabricate(store: Store, started: str, variants=("dot-product",), settings=None, ratio=1.0) -> str:
    """A stored run with what a board needs (a passed correctness check, a timed ratio), no worker involved."""
    store.path.parent.mkdir(parents=True, exist_ok=True)
    run = store.start_run(settings or {"name": "quick", "reference_length": 64}, {"device": "cpu", "cpu": "test"}, started)
    for variant in variants:
        card = {"plugin": "test", "card": {"summary": f"{variant} summary", "family": "softmax", "tags": {}}}
        store.record_job(run, variant, "correctness", "done", 0.1, card,
                         [{"check": "reference-float64", "status": "passed", "setting": "s", "value": 1e-16}])
        store.record_job(run, variant, "speed", "done", 0.1, card, [
            {"check": "x-torch-sdpa", "status": "measured", "value": ratio, "n": 64, "mode": "full", "phase": "fwd+bwd"},
            {"check": "time", "status": "measured", "value": 0.01 * ratio, "n": 64, "mode": "full", "phase": "fwd+bwd",
             "samples": [0.01, 0.011]}])
    store.finish_run(run, started)
    return run


def published(folder: Path, started: str = "2026-01-01 00:00:00") -> tuple[Store, list[str]]:
    """A folder whose board and export were written the way a run writes them: (its store, [its run])."""
    store = Store(folder / "results.sqlite")
    run = fabricate(store, started)
    render(store, run, folder, keep_runs=True)
    return store, [run]


def snapshot(folder: Path) -> dict[str, str]:
    """Every file of the folder outside its scratch space, by digest; the database by what it holds (a WAL
    checkpoint rewrites its bytes without changing a row), and whether there is one."""
    files = {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
             for p in sorted(folder.rglob("*"))
             if p.is_file() and ".zoo-cache" not in p.parts and not p.name.startswith("results.sqlite")}
    database = folder / "results.sqlite"
    if database.exists():
        runs = Store(database, readonly=True).records()
        files["results.sqlite"] = json.dumps({run_id: run.digest() for run_id, run in sorted(runs.items())})
    return files


def exported_runs(folder: Path) -> dict[str, str]:
    return {run_id: run.digest() for run_id, run in read_export(folder / "runs.jsonl").items()}


# --- the export only grows ---------------------------------------------------------------------------------


def test_a_stale_database_neither_hides_nor_shrinks_a_newer_export(tmp_path, capsys):
    """What a git pull gives: the export has a run the local database never saw."""
    folder, other = tmp_path / "board", tmp_path / "other-clone"
    store, [first] = published(folder)
    theirs = Store(other / "results.sqlite")
    other.mkdir()
    (other / "runs.jsonl").write_bytes((folder / "runs.jsonl").read_bytes())
    BoardFolder(other).for_writing()
    newer = fabricate(theirs, "2026-02-01 00:00:00", ratio=2.0)
    render(theirs, newer, other, keep_runs=True)
    shutil.copy(other / "runs.jsonl", folder / "runs.jsonl")  # the pull
    before = (folder / "runs.jsonl").read_bytes()

    status, _ = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 0
    assert (folder / "runs.jsonl").read_bytes() == before  # a read-only command never writes the export
    assert newer in (folder / "README.md").read_text()  # and the newer run is the board's
    status, _ = zoo_here(capsys, "compare", first, newer, "--out", folder)
    assert status == 0 and (folder / "runs.jsonl").read_bytes() == before
    assert set(Store(folder / "results.sqlite", readonly=True).runs().run_id) == {first}  # nor the database
    assert set(BoardFolder(folder).for_writing().runs().run_id) == {first, newer}  # a writer takes the export's runs



def test_a_publication_reads_the_export_again_only_when_it_changed_since_it_was_joined_or_agreed(tmp_path, monkeypatch):
    """A run joins the export as it opens the folder and again as it publishes; both are skipped for the bytes the
    database agreed with when they were last written (on the committed board each pass cost seconds) or this
    process already joined, never for a pull that came between."""
    folder, other = tmp_path / "board", tmp_path / "other-clone"
    published(folder)
    other.mkdir()
    (other / "runs.jsonl").write_bytes((folder / "runs.jsonl").read_bytes())
    theirs = BoardFolder(other).for_writing()
    pulled = fabricate(theirs, "2026-02-01 00:00:00")
    render(theirs, pulled, other, keep_runs=True)

    parsed = []
    monkeypatch.setattr("zoo.folder.parse_export", lambda data, path: parsed.append(path) or read_export(path))
    store = BoardFolder(folder).for_writing()
    mine = fabricate(store, "2026-03-01 00:00:00")
    render(store, mine, folder, keep_runs=True)
    assert parsed == []  # the database agreed with this export when it was published
    shutil.copy(other / "runs.jsonl", folder / "runs.jsonl")  # a pull before the next publication
    render(store, mine, folder, keep_runs=True)
    assert len(parsed) == 1 and {pulled, mine} <= set(read_export(folder / "runs.jsonl"))


def test_a_join_is_skipped_only_while_neither_the_database_nor_the_export_changed_since_they_agreed(
        tmp_path, monkeypatch, capsys):
    """After a publication the next commands neither read nor check the export's runs; a row changed in the
    database by another tool since (its write is counted whoever makes it), or another export, brings the full
    join back, and what it finds is said."""
    folder = tmp_path / "board"
    published(folder)
    parsed = []
    monkeypatch.setattr("zoo.folder.parse_export", lambda data, path: parsed.append(path) or read_export(path))
    BoardFolder(folder).for_writing()
    assert zoo_here(capsys, "leaderboard", "--out", folder)[0] == 0 and parsed == []

    with contextlib.closing(sqlite3.connect(folder / "results.sqlite")) as db, db:
        db.execute("UPDATE results SET value = 3.0 WHERE \"check\" = 'x-torch-sdpa'")
    status, lines = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 0 and len(parsed) == 1 and any("changed in results.sqlite since runs.jsonl" in line for line in lines)
    assert zoo_here(capsys, "leaderboard", "--out", folder)[0] == 0 and len(parsed) == 2  # still to say: not skipped

    BoardFolder(folder).publish({}, Store(folder / "results.sqlite"))  # the export takes the database's copy
    before = len(parsed)
    status, lines = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 0 and len(parsed) == before and not any("changed in" in line for line in lines)


def test_an_agreement_holds_only_if_nothing_was_written_since_it_was_decided(tmp_path):
    """Another process's write between deciding and recording an agreement voids it, and so does any later write."""
    store = Store(tmp_path / "results.sqlite")
    run = fabricate(store, "2026-01-01 00:00:00")
    decided = store.generation()
    fabricate(store, "2026-01-02 00:00:00")  # written meanwhile
    store.agree("a" * 64, decided)
    assert store.agreed_export() is None
    store.agree("a" * 64, store.generation())
    assert store.agreed_export() == "a" * 64
    store.finish_run(run, "2026-01-01 00:01:00")
    assert store.agreed_export() is None

def test_every_command_keeps_every_run_of_the_committed_board(tmp_path, capsys):
    """On a copy of the real committed board: leaderboard and compare change nothing, nor does an import refused
    for a duplicated line (what a bad git merge leaves); a smoke run of one variant's correctness (the command that
    once cut the export to its own run) and a merge keep every run the export had, line for line."""
    copy = tmp_path / "leaderboard"
    shutil.copytree(REPO / "leaderboard", copy, ignore=shutil.ignore_patterns("*.sqlite*", ".zoo-cache"))
    before, kept = snapshot(copy), exported_runs(copy)
    runs = sorted(kept)
    assert zoo_here(capsys, "leaderboard", "--out", copy)[0] == 0
    assert zoo_here(capsys, "compare", runs[0], runs[-1], "--out", copy)[0] == 0
    assert snapshot(copy) == before  # byte-identical board and export, and no database made
    export = (copy / "runs.jsonl").read_bytes()
    lines = export.splitlines(keepends=True)
    (copy / "runs.jsonl").write_bytes(b"".join(lines[:1001] + lines[1000:]))
    duplicated = snapshot(copy)
    status, said = zoo_here(capsys, "leaderboard", "--out", copy)
    assert status == 2 and len(said) == 1 and said[0].startswith(f"zoo: error: {copy / 'runs.jsonl'}:1002: ")
    assert said[0].endswith(f"appears twice (also at {copy / 'runs.jsonl'}:1001)")
    assert snapshot(copy) == duplicated  # refused before anything was written: no database, no board
    (copy / "runs.jsonl").write_bytes(export)

    done = run_zoo("run", "dot-product", "--profile", "smoke", "--suite", "correctness", "--out", copy)
    assert done.returncode == 0, done.stderr
    after = exported_runs(copy)
    assert {run: after.get(run) for run in kept} == kept and len(after) == len(kept) + 1

    elsewhere = tmp_path / "elsewhere"
    published(elsewhere)
    status, lines = zoo_here(capsys, "merge", elsewhere / "results.sqlite", "--out", copy)
    assert status == 0 and lines[0] == f"zoo: merged 1 run(s) from {elsewhere / 'results.sqlite'}", lines
    (merged_run,) = set(exported_runs(copy)) - set(after)  # an older run of another machine: the board drawn again
    assert lines[-1].startswith("zoo: leaderboard for run ") and merged_run not in lines[-1], lines
    merged = exported_runs(copy)
    assert {run: merged.get(run) for run in after} == after and len(merged) == len(after) + 1


def test_a_run_pruned_by_another_process_while_a_run_goes_on_comes_back_with_the_export_restored(tmp_path, capsys):
    """A `zoo run` has joined the folder; meanwhile another shell prunes a run and then restores the committed
    export (git checkout), which holds it again: when the run publishes, the pruned run is taken back from the
    export, as any fresh process would take it, not dropped from both because the export's bytes are the ones the
    running process joined."""
    folder = tmp_path / "board"
    store, [pruned] = published(folder)
    render(store, fabricate(store, "2026-02-01 00:00:00"), folder, keep_runs=True)
    committed = (folder / "runs.jsonl").read_bytes()
    running = BoardFolder(folder).for_writing()  # what `zoo run` opens before its first job
    new = fabricate(running, "2026-03-01 00:00:00")
    done = run_zoo("prune", pruned, "--out", folder)
    assert done.returncode == 0 and pruned not in exported_runs(folder), done.stderr
    (folder / "runs.jsonl").write_bytes(committed)
    render(running, new, folder, keep_runs=True)
    assert {pruned, new} <= set(exported_runs(folder)) and pruned in set(running.runs().run_id)


def test_three_hundred_runs_of_the_same_settings_are_all_kept(tmp_path, capsys):
    from zoo.export import RunRecords

    folder = tmp_path / "board"
    store = Store(folder / "results.sqlite")
    first = fabricate(store, "2026-01-01 00:00:00")
    model = store.records()[first]
    copies = []
    for i in range(1, 300):  # 299 more runs like it, written in one transaction
        run_id, started = f"2026-01-01T00{i // 60:02d}{i % 60:02d}-{i:06x}", f"2026-01-01 00:{i // 60:02d}:{i % 60:02d}"
        copies.append(RunRecords({**model.run, "run_id": run_id, "started": started},
                                 [{**job, "run_id": run_id} for job in model.jobs],
                                 [{**row, "run_id": run_id} for row in model.results]))
    store.add(copies)
    render(store, copies[-1].run_id, folder, keep_runs=True)
    assert len(exported_runs(folder)) == 300
    (folder / "results.sqlite").unlink()  # a fresh checkout
    before = (folder / "runs.jsonl").read_bytes()
    assert zoo_here(capsys, "leaderboard", "--out", folder)[0] == 0
    assert (folder / "runs.jsonl").read_bytes() == before
    elsewhere = tmp_path / "elsewhere"
    published(elsewhere, started="2026-03-01 00:00:00")
    assert zoo_here(capsys, "merge", elsewhere / "runs.jsonl", "--out", folder)[0] == 0
    assert len(exported_runs(folder)) == 301


def test_only_prune_removes_runs_and_it_names_each(tmp_path, capsys):
    """By name, or every run no board shows: each group of comparable runs keeps what its latest run's board shows,
    so a stray run of other settings does not cost the board's own runs."""
    folder = tmp_path / "board"
    store = Store(folder / "results.sqlite")
    old = fabricate(store, "2026-01-01 00:00:00")
    shown = fabricate(store, "2026-01-02 00:00:00")  # the same settings: its board shows only itself
    stray = fabricate(store, "2026-01-03 00:00:00", settings={"name": "smoke", "reference_length": 64})
    render(store, stray, folder, keep_runs=True)
    board = snapshot(folder)
    status, lines = zoo_here(capsys, "prune", "--unshown", "--dry-run", "--out", folder)
    assert status == 0 and lines == [f"zoo: would remove run {old} (started 2026-01-01 00:00:00, 2 jobs, 3 rows)",
                                     "zoo: would remove 1 run(s) from results.sqlite and runs.jsonl"], lines
    assert snapshot(folder) == board
    assert zoo_here(capsys, "prune", "--out", folder)[0] == 2  # neither runs nor --unshown: nothing chosen
    status, lines = zoo_here(capsys, "prune", "--unshown", "--out", folder)
    assert status == 0 and lines[0] == f"zoo: removed run {old} (started 2026-01-01 00:00:00, 2 jobs, 3 rows)"
    assert set(exported_runs(folder)) == {shown, stray} and set(store.runs().run_id) == {shown, stray}
    status, lines = zoo_here(capsys, "prune", shown[:13], "--out", folder)  # a unique prefix
    assert status == 0 and set(exported_runs(folder)) == {stray}
    assert {k: v for k, v in snapshot(folder).items() if k not in ("runs.jsonl", "results.sqlite")} == \
        {k: v for k, v in board.items() if k not in ("runs.jsonl", "results.sqlite")}  # the board did not change


def test_a_board_never_shows_a_run_prune_removed(tmp_path, capsys):
    """Pruning the run the board shows draws the board again from the runs left, so no file of it names the run
    removed (or holds its rows); pruning the last run leaves the files and says so in one line."""
    folder = tmp_path / "board"
    store = Store(folder / "results.sqlite")
    first = fabricate(store, "2026-01-01 00:00:00", ratio=1.0)
    second = fabricate(store, "2026-01-02 00:00:00", ratio=2.0)
    render(store, second, folder, keep_runs=True)
    assert second in (folder / "README.md").read_text()
    status, lines = zoo_here(capsys, "prune", second, "--out", folder)
    assert status == 0 and lines[-1] == f"zoo: leaderboard for run {first} written to {folder / 'README.md'}", lines
    for name in ("README.md", "index.html", "results.csv"):
        text = (folder / name).read_text()
        assert second not in text and first in text, name
    assert set(pd.read_csv(folder / "results.csv").run_id) == {first}
    board = snapshot(folder)
    status, lines = zoo_here(capsys, "prune", first, "--out", folder)
    assert status == 0 and lines[-1] == f"zoo: no run is left in {str(folder)!r}: its board still shows the runs removed"
    assert {k: v for k, v in snapshot(folder).items() if k not in ("runs.jsonl", "results.sqlite")} == \
        {k: v for k, v in board.items() if k not in ("runs.jsonl", "results.sqlite")}
    assert exported_runs(folder) == {}


def test_prune_and_merge_change_nothing_when_a_plugin_fails_to_load_and_a_board_not_drawn_names_the_command(
        tmp_path, capsys, monkeypatch):
    """The registry is loaded before a run is removed or added, so a plugin that fails under --strict leaves the
    store and the board as they were; a board that cannot be drawn again (runs published anew at every draw) is one
    warning naming `zoo leaderboard`, the runs removed all the same."""
    folder = tmp_path / "board"
    store = Store(folder / "results.sqlite")
    first = fabricate(store, "2026-01-01 00:00:00")
    second = fabricate(store, "2026-01-02 00:00:00")
    render(store, second, folder, keep_runs=True)
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "broken.py").write_text("raise RuntimeError('broken on import')\n")
    newer = tmp_path / "newer" / "results.sqlite"
    fabricate(Store(newer), "2026-01-03 00:00:00")  # a run a merge would add
    before = snapshot(folder)
    for args in (("prune", second), ("merge", newer)):
        status, _ = zoo_here(capsys, *args, "--out", folder, "--plugins-dir", broken, "--strict")
        assert status == 2 and snapshot(folder) == before, args

    from zoo.folder import RunsChanged

    def changed(*args, **kwargs):
        raise RunsChanged("the runs changed")
    monkeypatch.setattr("zoo.leaderboard.render", changed)
    status, lines = zoo_here(capsys, "prune", second, "--out", folder)
    assert status == 0 and set(exported_runs(folder)) == {first}
    assert lines[-1].startswith("zoo: warning: the board was not drawn again") and \
        lines[-1].endswith(f"zoo leaderboard --out {str(folder)!r} draws it"), lines


def test_prune_unshown_keeps_an_unfinished_run_and_a_run_pruned_by_name_has_its_next_write_refused(tmp_path, capsys):
    """--unshown keeps the latest unfinished run this machine started (a `zoo run` in progress, or what --resume
    continues) and says so; an unfinished run another machine started is removed like any unshown run. Named, the
    kept run goes, and its next job or its finish is refused naming it, not stored as rows of no run (which no board
    shows and no export keeps). A mistyped folder is refused, not made."""
    import socket

    folder = tmp_path / "board"
    store, [old] = published(folder)
    settings = {"name": "quick", "reference_length": 64}
    runs = {}
    for host, started in (("another-machine", "2026-01-10 00:00:00"), (socket.gethostname(), "2026-01-15 00:00:00")):
        runs[host] = store.start_run(settings, {"device": "cpu", "cpu": "test", "host": host}, started)
        store.record_job(runs[host], "dot-product", "correctness", "done", 0.1, {}, [])  # then stopped, or going on
    elsewhere, going = runs["another-machine"], runs[socket.gethostname()]
    latest = fabricate(store, "2026-02-01 00:00:00")  # its board shows none of the three: each is unshown
    status, lines = zoo_here(capsys, "prune", "--unshown", "--out", folder)
    assert status == 0 and lines[-3:] == [
        "zoo: removed 2 run(s) from results.sqlite and runs.jsonl",
        f"zoo: kept run {going}: unfinished and started on this machine, so in progress or what --resume continues; "
        "name it to remove it",
        f"zoo: leaderboard for run {latest} written to {folder / 'README.md'}"], lines  # its board showed old
    assert set(store.runs().run_id) == {going, latest} and {old, elsewhere}.isdisjoint(exported_runs(folder))
    status, lines = zoo_here(capsys, "prune", going, "--out", folder)
    assert status == 0 and set(store.runs().run_id) == {latest}
    with pytest.raises(StoreError, match=f"^run {going!r} is no longer in .*results.sqlite.* \\(removed by `zoo "
                                         "prune` while it ran\\?\\): its linear/speed job was not recorded$"):
        store.record_job(going, "linear", "speed", "done", 0.1, {}, [])
    with pytest.raises(StoreError, match="it was not marked finished$"):
        store.finish_run(going, "2026-02-01 00:01:00")
    assert set(store.runs().run_id) == {latest} and store.finished_jobs(going) == set()
    for dry in ([], ["--dry-run"]):
        status, lines = zoo_here(capsys, "prune", "--unshown", *dry, "--out", tmp_path / "typo")
        assert status == 2 and lines == [f"zoo: error: --out: no results database at "
                                         f"{str(tmp_path / 'typo' / 'results.sqlite')!r} nor its export runs.jsonl: "
                                         "nothing to prune"], lines
    assert not (tmp_path / "typo").exists()


def test_prune_unshown_judges_by_the_suites_of_the_registry_it_loads_plugins_included(tmp_path, capsys):
    """Which run a board shows can hang on a plugin's suite: one whose cells spread far more than the board's is
    held back, and the board stays on the run before it. --unshown judges with the suites --plugins-dir loads, so
    it keeps that earlier run; judged by the built-in suites alone, the noisy run would be the board's and the
    earlier one would go."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "jitter.py").write_text(
        "import zoo\n\n\ndef noise(rows):\n    rows = rows[rows.check == 'spread']\n"
        "    return rows.set_index(['variant', 'mode', 'phase', 'n']).value\n\n\n"
        "@zoo.hookimpl\ndef zoo_register_suites(register):\n"
        "    register(zoo.Suite('jitter', 'a timed suite of a plugin', noise=noise))\n")
    folder = tmp_path / "board"
    folder.mkdir()
    store = Store(folder / "results.sqlite")
    runs = []
    for started, spread in (("2026-01-01 00:00:00", 0.01), ("2026-01-02 00:00:00", 0.5)):
        run = store.start_run({"name": "quick", "reference_length": 64}, {"device": "cpu", "cpu": "test"}, started)
        store.record_job(run, "dot-product", "correctness", "done", 0.1, {"plugin": "test"},
                         [{"check": "reference-float64", "status": "passed", "setting": "s", "value": 1e-16}])
        store.record_job(run, "dot-product", "jitter", "done", 0.1, {"plugin": "test"},
                         [{"check": "spread", "status": "measured", "value": spread, "n": 64, "mode": "full",
                           "phase": "fwd"}])
        store.finish_run(run, started)
        runs.append(run)
    quiet = runs[0]
    render(store, quiet, folder, keep_runs=True)
    status, lines = zoo_here(capsys, "prune", "--unshown", "--dry-run", "--out", folder, "--plugins-dir", plugins)
    assert status == 0 and lines[-1] == "zoo: would remove 0 run(s) from results.sqlite and runs.jsonl", lines
    status, lines = zoo_here(capsys, "prune", "--unshown", "--dry-run", "--out", folder)  # no suite holds it back
    assert status == 0 and lines[-2:] == [
        f"zoo: would remove run {quiet} (started 2026-01-01 00:00:00, 2 jobs, 2 rows)",
        "zoo: would remove 1 run(s) from results.sqlite and runs.jsonl"], lines


def test_prune_never_removes_a_run_that_lands_while_it_decides(tmp_path):
    folder = tmp_path / "board"
    store, [first] = published(folder)
    landed = []

    def choose(joined):
        landed.append(fabricate(Store(folder / "results.sqlite"), "2026-02-01 00:00:00"))  # another process's run
        return set(joined.runs().run_id) | set(landed)  # even when asked for it: it was not there to decide on

    removed = BoardFolder(folder).prune(choose)
    assert [run.run_id for run in removed] == [first] and set(store.runs().run_id) == set(landed)


def test_a_run_whose_export_copy_is_not_the_one_written_is_an_error_and_nothing_changes(tmp_path, capsys):
    """An older runs.jsonl checked out after a newer run was written, a hand edit, a bad merge: never a silent
    pick, never a shrunk run."""
    folder = tmp_path / "board"
    store, [run] = published(folder)
    older = (folder / "runs.jsonl").read_bytes()
    store.record_job(run, "linear", "correctness", "done", 0.1, {}, [])  # resumed: one more job
    published(tmp_path / "unrelated")
    assert zoo_here(capsys, "merge", tmp_path / "unrelated" / "results.sqlite", "--out", folder)[0] == 0
    (folder / "runs.jsonl").write_bytes(older)  # git checkout HEAD~1 -- runs.jsonl
    before = snapshot(folder)
    for args in (["leaderboard"], ["compare", run, run], ["prune", "--unshown"], ["merge", folder / "runs.jsonl"],
                 ["run", "dot-product", "--suite", "correctness", "--profile", "smoke"]):
        status, out = zoo_here(capsys, *args, "--out", folder)
        assert status == 2 and len(out) == 1 and f"run {run!r}" in out[0] and "not the one this database last wrote" \
            in out[0], (args, out)
    assert snapshot(folder) == before
    assert "linear" in set(store.jobs(run).variant)


def test_a_run_changed_here_since_it_was_exported_keeps_the_databases_copy_says_so_and_is_exported_next(tmp_path,
                                                                                                       capsys):
    folder = tmp_path / "board"
    store, [run] = published(folder)
    store.record_job(run, "linear", "correctness", "done", 0.1, {}, [])  # a resumed run, not yet exported
    assert "linear" in set(BoardFolder(folder).for_reading().jobs(run).variant)
    status, lines = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 0 and any(f"1 run(s) changed in results.sqlite since runs.jsonl last held them (resumed or "
                               f"retried here: {run} (2 jobs, 3 rows exported, 3 jobs, 3 rows here)); the board shows "
                               "this database's copy" in line for line in lines), lines  # never silently
    published(tmp_path / "unrelated")
    status, lines = zoo_here(capsys, "merge", tmp_path / "unrelated" / "results.sqlite", "--out", folder)
    assert status == 0 and any(f"{run} (2 jobs" in line and "runs.jsonl now takes this database's copy" in line
                               for line in lines), lines
    assert "linear" in {job["variant"] for job in read_export(folder / "runs.jsonl")[run].jobs}  # exported now
    status, lines = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 0 and not any("changed in" in line for line in lines), lines  # agreed again: nothing to say


def test_a_board_drawn_from_runs_the_export_lacks_says_so(tmp_path, capsys):
    folder = tmp_path / "board"
    store, _ = published(folder)
    later = fabricate(store, "2026-02-01 00:00:00")  # recorded here, never exported
    store.start_run({"name": "quick"}, {"device": "cpu"}, "2026-01-15 00:00:00")  # stopped before its first job
    status, lines = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 0 and f"zoo: warning: 1 run(s) in results.sqlite are not in runs.jsonl yet ({later}); the next " \
        f"`zoo run` or `zoo merge` into {folder} adds them" in lines, lines  # not the one with no job: never exported


def test_a_run_with_no_job_yet_is_never_exported_nor_brought_back(tmp_path, capsys):
    """One starting while a merge exports, then discarded because it stopped before any job finished."""
    folder = tmp_path / "board"
    store, [run] = published(folder)
    starting = store.start_run({"name": "quick"}, {"device": "cpu"}, "2026-03-01 00:00:00")
    published(tmp_path / "unrelated")
    assert zoo_here(capsys, "merge", tmp_path / "unrelated" / "runs.jsonl", "--out", folder)[0] == 0
    assert starting not in exported_runs(folder)
    store.discard_if_empty(starting)
    zombie = json.dumps({"table": "runs", **{key: value for key, value in store.records()[run].run.items()
                                             if key != "job_count"}, "run_id": "2026-03-02T0000-zombie"})
    (folder / "runs.jsonl").write_text((folder / "runs.jsonl").read_text() + zombie + "\n")  # one an older zoo wrote
    assert "2026-03-02T0000-zombie" not in set(BoardFolder(folder).for_reading().runs().run_id)
    assert starting not in set(BoardFolder(folder).for_writing().runs().run_id)


def test_resume_continues_only_a_run_this_machine_started_and_with_its_own_settings(tmp_path, capsys):
    folder = tmp_path / "board"
    store = Store(folder / "results.sqlite")
    fabricate(store, "2026-01-01 00:00:00")  # no host recorded: a committed board's run, say
    with sqlite3.connect(store.path) as db:
        db.execute("UPDATE runs SET finished = NULL")
    status, out = zoo_here(capsys, "run-all", "--resume", "--out", folder)
    assert status == 2 and out == [f"zoo: error: --resume: no unfinished run this machine started in "
                                   f"{str(folder / 'results.sqlite')!r} (1 started on other machines)"], out
    status, out = zoo_here(capsys, "run-all", "--resume", "--profile", "smoke", "--lengths", "64", "--out", folder)
    assert status == 2 and "--profile, --lengths cannot change them" in out[0], out
    status, out = zoo_here(capsys, "run", "dot-product", "--resume", "--out", tmp_path / "nothing-here")
    assert status == 2 and "no run to continue" in out[0] and not (tmp_path / "nothing-here").exists()


def test_resume_refuses_a_run_that_timed_in_another_form_than_this_zoo(tmp_path, capsys):
    """Its remaining jobs would time other calls than its finished ones under the one form the run records."""
    import socket

    from zoo.checks import TIMING_FORM

    folder = tmp_path / "board"
    folder.mkdir()
    run = Store(folder / "results.sqlite").start_run({"name": "quick", "reference_length": 64},
                                                     {"device": "cpu", "host": socket.gethostname()},
                                                     "2026-01-01 00:00:00")  # no timing_form: form 1
    status, out = zoo_here(capsys, "run-all", "--resume", "--out", folder)
    assert status == 2 and out == [f"zoo: error: --resume: run {run} timed in form 1 and this zoo times in form "
                                   f"{TIMING_FORM} (zoo.checks.TIMING_FORM); start a new run without --resume"], out


def test_a_publication_whose_scratch_is_on_another_filesystem_or_that_cannot_rename_finishes_or_says_why(
        tmp_path, capsys):
    """.zoo-cache linked to another filesystem: its files cannot be renamed into place (EXDEV), so each is copied
    beside its target and renamed from there, and the board is published whole. A rename that fails otherwise past
    the commit point is one line naming the file, the journal is kept, and the next command finishes it."""
    folder = tmp_path / "board"
    _, second, _, new = _two_boards(folder)
    real = os.replace
    failure = [errno.EXDEV]

    def refusing(src, dst):
        if ".zoo-cache" in Path(src).parts and ".zoo-cache" not in Path(dst).parts:
            raise OSError(failure[0], os.strerror(failure[0]))
        return real(src, dst)

    unchanged = {k: v for k, v in new.items() if k not in ("runs.jsonl", "results.sqlite")}  # no export is written
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", refusing)
        assert zoo_here(capsys, "leaderboard", "--run", second, "--out", folder)[0] == 0
        assert {k: v for k, v in snapshot(folder).items() if k not in ("runs.jsonl", "results.sqlite")} == unchanged
        assert not list(folder.glob(".*.zoo-staged")) and not (folder / ".zoo-cache" / "publish.json").exists()
        (folder / "README.md").write_text("an older board\n")
        failure[0] = errno.EACCES
        status, out = zoo_here(capsys, "leaderboard", "--run", second, "--out", folder)
        assert status == 2 and out[-1].startswith("zoo: error: --out: cannot put ") and out[-1].endswith(
            f" in place in {str(folder)!r} (Permission denied); the publication is kept in .zoo-cache, and the next "
            "command on the folder that can finishes it"), out
    assert (folder / ".zoo-cache" / "publish.json").exists()
    assert zoo_here(capsys, "compare", second, second, "--out", folder)[0] == 0  # it can rename: it finishes it
    assert not (folder / ".zoo-cache" / "publish.json").exists()
    assert {k: v for k, v in snapshot(folder).items() if k not in ("runs.jsonl", "results.sqlite")} == unchanged


@pytest.mark.parametrize("scratch_elsewhere", [False, True], ids=["scratch here", "scratch on another filesystem"])
def test_each_step_of_a_publication_is_on_disk_before_the_next_so_a_power_cut_cannot_mix_two_boards(
        tmp_path, capsys, scratch_elsewhere):
    """Renames and removals are on disk only once their folder is synced: the staged files and the staging folder
    before the journal names them, the journal before the first file is put in place, every file in place before
    the journal goes; a staged file copied across filesystems is removed only after that (its removal could reach
    the disk before the rename)."""
    import zoo.folder

    folder = tmp_path / "board"
    _, second, _, _ = _two_boards(folder)
    scratch, journal = folder / ".zoo-cache", folder / ".zoo-cache" / "publish.json"
    real_replace, real_sync = os.replace, zoo.folder._sync_folder
    steps = []

    def replacing(src, dst):
        if scratch_elsewhere and Path(src).parent.parent == scratch and Path(dst).parent == folder:
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real_replace(src, dst)
        steps.append(("journal" if Path(dst) == journal else "in place" if Path(dst).parent == folder else "other"))

    def syncing(path):
        real_sync(path)
        path = Path(path)
        staged = sum(1 for p in scratch.glob("publish-*/*"))
        steps.append("staging synced" if path.parent == scratch else "scratch synced" if path == scratch else
                     f"folder synced, journal {'kept' if journal.exists() else 'gone'}, {staged} staged"
                     if path == folder else "other")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", replacing)
        patch.setattr(zoo.folder, "_sync_folder", syncing)
        assert zoo_here(capsys, "leaderboard", "--run", second, "--out", folder)[0] == 0
    placed = steps.count("in place")
    assert placed >= 2 and steps == ["staging synced", "scratch synced", "journal", "scratch synced",
                                     *["in place"] * placed,
                                     f"folder synced, journal kept, {placed if scratch_elsewhere else 0} staged"], steps
    assert not journal.exists() and not list(scratch.glob("publish-*"))


def test_a_journal_not_synced_is_finished_by_the_next_command_and_an_unreadable_folder_still_publishes(
        tmp_path, capsys):
    """Past the commit point a failure keeps what was staged (it was all dropped as if nothing were committed, and
    the next command carried out only the journal's removals); a folder that can be written and not read (its
    entries cannot be opened to sync) publishes as before."""
    import zoo.folder

    folder = tmp_path / "board"
    _, second, _, new = _two_boards(folder)
    scratch, journal = folder / ".zoo-cache", folder / ".zoo-cache" / "publish.json"
    real_sync, real_open = zoo.folder._sync_folder, os.open
    boards = {k: v for k, v in new.items() if k not in ("runs.jsonl", "results.sqlite")}

    def failing_once_committed(path):
        if Path(path) == scratch and journal.exists():
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        real_sync(path)

    (folder / "README.md").write_text("an older board\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zoo.folder, "_sync_folder", failing_once_committed)
        status, out = zoo_here(capsys, "leaderboard", "--run", second, "--out", folder)
    assert status == 2 and "cannot write the journal to disk" in out[-1] and "next command on the folder" in out[-1]
    assert journal.exists() and list(scratch.glob("publish-*/README.md"))
    assert zoo_here(capsys, "compare", second, second, "--out", folder)[0] == 0  # it finishes the publication
    assert {k: v for k, v in snapshot(folder).items() if k in boards} == boards and not journal.exists()

    def unreadable_folders(path, flags, *args, **kwargs):
        if flags & os.O_DIRECTORY:
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(path))
        return real_open(path, flags, *args, **kwargs)

    (folder / "README.md").write_text("an older board\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "open", unreadable_folders)
        assert zoo_here(capsys, "leaderboard", "--run", second, "--out", folder)[0] == 0
    assert {k: v for k, v in snapshot(folder).items() if k in boards} == boards and not journal.exists()


def test_a_stale_journal_never_overwrites_a_file_changed_since_and_a_foreign_one_touches_nothing(tmp_path, capsys):
    from zoo.folder import JOURNAL

    folder = tmp_path / "board"
    store, second, old, new = _two_boards(folder)
    real = os.replace

    def dies_after_the_commit_point(src, dst):  # the journal is written, nothing renamed yet
        real(src, dst)
        if Path(dst).name == JOURNAL:
            raise KeyboardInterrupt

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(os, "replace", dies_after_the_commit_point)
        with pytest.raises(KeyboardInterrupt):
            render(store, second, folder, keep_runs=True)
    pulled = (folder / "runs.jsonl").read_bytes() + (folder / "runs.jsonl").read_bytes().replace(b"2026-01-01T", b"2026-01-09T")
    (folder / "runs.jsonl").write_bytes(pulled)  # a teammate's run arrives by git pull before the next command
    BoardFolder(folder).for_reading()
    assert (folder / "runs.jsonl").read_bytes() == pulled  # not the staged copy
    assert {k: v for k, v in _board_files(snapshot(folder)).items() if k != "runs.jsonl"} == \
        {k: v for k, v in _board_files(new).items() if k != "runs.jsonl"}  # the rest of the publication finished

    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep").write_text("mine")
    for journal in ('{"staging": "../../victim", "files": [], "remove": [], "before": {}}',
                    '{"staging": "publish-1", "files": [], "remove": ["runs.jsonl", "index.html"], "before": {}}',
                    '{"staging": "publish-1", "files": ["../victim"], "remove": [], "before": {}}',
                    "", "[1]", '{"files": []}', "not json", "[" * 200_000):
        before = snapshot(folder)
        (folder / ".zoo-cache" / JOURNAL).write_text(journal)
        assert zoo_here(capsys, "compare", "x", "x", "--out", folder)[0] == 2  # no such run: but no traceback
        assert snapshot(folder) == before and (victim / "keep").read_text() == "mine", journal
        assert not (folder / ".zoo-cache" / JOURNAL).exists()


# --- a validated import ------------------------------------------------------------------------------------


def _line(folder: Path, table: str) -> int:
    lines = (folder / "runs.jsonl").read_text().splitlines()
    return next(i for i, line in enumerate(lines) if json.loads(line)["table"] == table)


def _set(column, value):
    def edit(record):
        record[column] = value
        return record

    return edit


def _inside(column: str, change):
    """An edit of the JSON object stored as text in ``column``."""
    return lambda record: {**record, column: json.dumps(change(json.loads(record[column])))}


BAD_LINES = [
    ("runs", _set("settings", 5), "runs.settings: expected JSON text of an object, got 5"),
    ("runs", _set("settings", "a string"), "runs.settings: expected JSON text of an object, got text that is not JSON"),
    ("runs", _set("run_id", None), "runs.run_id: expected text, got null"),
    ("runs", _set("run_id", 123), "runs.run_id: expected text, got 123"),
    ("results", _set("n", "abc"), 'results.n: expected an integer (64-bit) or null, got "abc"'),
    ("results", _set("value", "abc"), 'results.value: expected a finite number or null, got "abc"'),
    ("results", _set("samples", "[1, 2"), "results.samples: expected JSON text of a list of numbers, got text"),
    ("results", _set("status", "great"), "results.status: expected one of passed"),
    ("jobs", _set("provenance", "xyz"), "jobs.provenance: expected JSON text of an object, got text that is not JSON"),
    ("jobs", _set("run_id", "no-such-run"), "a jobs record of run 'no-such-run', which has no runs line"),
    ("results", _set("suite", "no-such-job"), "a result row of job dot-product/no-such-job"),
    ("jobs", lambda r: {k: v for k, v in r.items() if k != "seconds"}, "a jobs record without seconds"),
    ("jobs", _set("dropped", 1), "a jobs record with columns this zoo does not know: dropped"),
    ("runs", _set("table", "nothing"), "'table' must be one of runs, jobs, results"),
    ("results", _set("value", float("inf")), "results.value: expected a finite number or null, got inf"),
    ("results", _set("detail", "\ud800"), "results.detail: expected text, got a string with a lone surrogate"),
    ("results", _set("samples", "[1.0, NaN]"), "results.samples: expected JSON text of a list of finite numbers"),
    ("runs", _inside("settings", lambda s: {**s, "suites": "abc"}),
     "runs.settings: suites: expected an object of each suite's object of settings, got \"abc\""),
    ("runs", _inside("settings", lambda s: {**s, "suites": {"speed": {"lengths": "abc"}}}),
     'runs.settings: speed.lengths: expected a list, got "abc"'),
    ("runs", _inside("settings", lambda s: {**s, "threads": "two"}), 'runs.settings: threads: expected an integer'),
    ("jobs", _inside("provenance", lambda p: {**p, "card": 5}), "jobs.provenance: card: expected an object, got 5"),
    ("jobs", _inside("provenance", lambda p: {**p, "card": {**p["card"], "tags": "abc"}}),
     'jobs.provenance: card.tags: expected an object, got "abc"'),
    ("jobs", _inside("provenance", lambda p: {**p, "card": {**p["card"], "targets": [5]}}),
     "jobs.provenance: card.targets: item 0: expected an object, got 5"),
    ("results", _set("n", -5), "results.n: expected an integer of 0 or more or null, got -5"),
    ("jobs", _set("seconds", -1), "jobs.seconds: expected a duration of 0 s or more or null, got -1"),
    ("jobs", _set("row_count", -1), "jobs.row_count: expected an integer of 0 or more or null, got -1"),
    ("runs", _set("job_count", 1.5), "runs.job_count: expected an integer (64-bit) or null, got 1.5"),
]


@pytest.mark.parametrize("table, edit, message", BAD_LINES, ids=[m.split(":")[0] for _, _, m in BAD_LINES])
def test_a_bad_export_line_is_refused_by_file_and_line_before_anything_is_written(tmp_path, capsys, table, edit, message):
    folder = tmp_path / "board"
    published(folder)
    (folder / "results.sqlite").unlink()  # a fresh checkout: nothing but the committed files
    lines = (folder / "runs.jsonl").read_text().splitlines()
    number = _line(folder, table)
    lines[number] = json.dumps(edit(json.loads(lines[number])))
    (folder / "runs.jsonl").write_text("\n".join(lines) + "\n")
    before = snapshot(folder)
    status, out = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 2 and len(out) == 1, out
    assert f"runs.jsonl:{number + 1}: " in out[0] and message in out[0], out[0]
    assert snapshot(folder) == before  # no database left behind, no board file touched


def _speed_row(lines: list[str]) -> int:
    return next(i for i, line in enumerate(lines) if '"suite": "speed"' in line and '"table": "results"' in line)


def _without_job(lines: list[str], i: int) -> list[str]:
    """The lines without the jobs line and the rows of the job whose row is line ``i``: nothing else refers to it."""
    job = {key: json.loads(lines[i])[key] for key in ("run_id", "variant", "suite")}
    return [line for line in lines if json.loads(line)["table"] == "runs"
            or any(json.loads(line)[key] != value for key, value in job.items())]


def _without_last_row_of_job(lines: list[str], i: int) -> list[str]:
    """The lines without the last result line of the job whose row is line ``i``: every row before it keeps its
    place, so only the count its jobs line recorded can tell."""
    job = {key: json.loads(lines[i])[key] for key in ("run_id", "variant", "suite")}
    last = max(j for j, line in enumerate(lines) if json.loads(line)["table"] == "results"
               and all(json.loads(line)[key] == value for key, value in job.items()))
    return [*lines[:last], *lines[last + 1:]]


FILE_EDITS = [
    ("a duplicated result line", lambda lines, i: [*lines[:i + 1], lines[i], *lines[i + 1:]], "appears twice (also at"),
    ("a result line lost", lambda lines, i: [*lines[:i], *lines[i + 1:]], "comes first: a line is missing"),
    ("the last result line of a job lost", _without_last_row_of_job, "recorded 2 rows, 1 is here: a row is missing"),
    ("a whole job lost", _without_job, "recorded 2 jobs, 1 is here: a job is missing"),
    ("a line nested too deeply", lambda lines, i: [*lines[:i], "[" * 100000 + "]" * 100000, *lines[i + 1:]],
     "not a JSON line (nested too deeply)"),
]


@pytest.mark.parametrize("edit, message", [edit[1:] for edit in FILE_EDITS], ids=[edit[0] for edit in FILE_EDITS])
def test_a_line_duplicated_or_lost_is_seen(tmp_path, capsys, edit, message):
    folder = tmp_path / "board"
    published(folder)
    (folder / "results.sqlite").unlink()
    lines = (folder / "runs.jsonl").read_text().splitlines()
    (folder / "runs.jsonl").write_text("\n".join(edit(lines, _speed_row(lines))) + "\n")
    before = snapshot(folder)
    status, out = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 2 and len(out) == 1 and message in out[0], out
    assert snapshot(folder) == before


def test_a_database_row_lost_is_seen_before_it_is_merged(tmp_path, capsys):
    folder = tmp_path / "board"
    store, [run] = published(folder)
    with sqlite3.connect(store.path) as db:  # the speed job's last row, deleted by hand
        db.execute("DELETE FROM results WHERE rowid = (SELECT MAX(rowid) FROM results WHERE suite = 'speed')")
    other = tmp_path / "other"
    status, out = zoo_here(capsys, "merge", store.path, "--out", other)
    assert status == 2 and len(out) == 1, out
    assert f"(jobs of run {run!r}): job dot-product/speed of run {run!r} recorded 2 rows, 1 is here" in out[0], out
    assert not (other / "results.sqlite").exists()


def test_a_duplicated_line_an_orphan_jobs_line_and_a_byte_that_is_not_utf8_are_refused_by_every_command(tmp_path,
                                                                                                        capsys):
    folder = tmp_path / "board"
    published(folder)
    (folder / "results.sqlite").unlink()
    good = (folder / "runs.jsonl").read_bytes()
    first = good.split(b"\n")[0]
    lines = good.decode().splitlines()
    at = _line(folder, "jobs")
    orphan = "\n".join([*lines[:at], json.dumps({**json.loads(lines[at]), "run_id": "no-such-run"}), *lines[at + 1:]])
    for bad, message in ((first + b"\n" + good, "runs.jsonl:2: run "),
                         ((orphan + "\n").encode(), f"runs.jsonl:{at + 1}: a jobs record of run 'no-such-run'"),
                         (good + b'{"table": "\xff"}\n', "not UTF-8 text (byte 0xff at column 12)")):
        (folder / "runs.jsonl").write_bytes(bad)
        before = snapshot(folder)
        for args in (["leaderboard"], ["compare", "a", "b"], ["prune", "--unshown"],
                     ["run", "dot-product", "--suite", "correctness", "--profile", "smoke"]):
            status, out = zoo_here(capsys, *args, "--out", folder)
            assert status == 2 and len(out) == 1 and message in out[0], (args, out)
        other = tmp_path / "other"
        status, out = zoo_here(capsys, "merge", folder / "runs.jsonl", "--out", other)
        assert status == 2 and message in out[0]
        assert snapshot(folder) == before and not (other / "results.sqlite").exists()


def test_a_row_a_plugin_got_wrong_is_stored_as_an_error_row_that_reads_back(tmp_path):
    folder = tmp_path / "board"
    store, [run] = published(folder)
    store.record_job(run, "dot-product", "evil", "done", 0.1, {}, [
        {"check": "", "status": "passed"}, {"check": "   ", "status": "passed"},
        {"check": "samples", "status": "measured", "samples": ["a"]}, {"check": "surrogate", "status": "passed",
                                                                       "detail": "\ud800"},
        {"check": "huge", "status": "measured", "n": 2 ** 63}, {"check": "infinite", "status": "measured",
                                                                 "value": float("inf")},
        {"check": "numpy", "status": "measured", "value": __import__("numpy").float32(0.5), "n": 64.0},
        {"check": "nan", "status": "measured", "value": float("nan")}])
    rows = store.results(run)
    rows = rows[rows.suite == "evil"]
    assert list(rows.status) == ["error"] * 6 + ["measured"] * 2
    assert list(rows.check) == ["invalid-row", "invalid-row", "samples", "surrogate", "huge", "infinite", "numpy", "nan"]
    assert all("the check yielded a row the store cannot keep" in detail for detail in rows.detail[:6])
    assert rows.value.iloc[6] == 0.5 and rows.n.iloc[6] == 64 and pd.isna(rows.value.iloc[7])
    render(store, run, folder, keep_runs=True)
    assert read_export(folder / "runs.jsonl")[run].describe() == "3 jobs, 11 rows"  # what was written reads back


@pytest.mark.parametrize("edit, message", [
    ("UPDATE results SET value = 'abc'", "results.value: expected a finite number or null, got \"abc\""),
    ("UPDATE runs SET settings = '5'", "runs.settings: expected JSON text of an object, got JSON int"),
    ("UPDATE results SET detail = CAST('x' AS BLOB)", "results.detail: expected text"),
    ("ALTER TABLE jobs DROP COLUMN seconds", "its jobs table has no seconds column"),
])
def test_a_database_edited_by_hand_is_refused_by_every_command_naming_it(tmp_path, capsys, edit, message):
    folder = tmp_path / "board"
    published(folder)
    with sqlite3.connect(folder / "results.sqlite") as db:
        db.execute(edit)
        db.execute("PRAGMA journal_mode = DELETE")  # so that its bytes are what it holds
    before = _digest(folder / "results.sqlite")
    for args in (["leaderboard"], ["compare", "x", "x"], ["run", "dot-product", "--suite", "correctness",
                                                           "--profile", "smoke"]):
        status, out = zoo_here(capsys, *args, "--out", folder)
        assert status == 2 and len(out) == 1 and "results.sqlite" in out[0] and message in out[0], (args, out)
    assert _digest(folder / "results.sqlite") == before


def test_another_databases_values_are_checked_before_they_are_merged(tmp_path, capsys):
    import sqlite3

    source_folder, folder = tmp_path / "source", tmp_path / "board"
    published(source_folder)
    with sqlite3.connect(source_folder / "results.sqlite") as db:
        db.execute("UPDATE results SET n = 'abc'")  # SQLite keeps text in an INTEGER column
    published(folder)
    before = snapshot(folder)
    status, out = zoo_here(capsys, "merge", source_folder / "results.sqlite", "--out", folder)
    assert status == 2 and "results.n: expected an integer" in out[0] and "results.sqlite" in out[0]
    assert snapshot(folder) == before


# --- atomic output ------------------------------------------------------------------------------------------


def _two_boards(folder: Path) -> tuple[Store, str, dict, dict]:
    """A folder showing run A, and what it holds once run B is published: (store, B, old files, new files)."""
    store = Store(folder / "results.sqlite")
    first = fabricate(store, "2026-01-01 00:00:00", variants=("dot-product", "linear"))
    render(store, first, folder, keep_runs=True)
    old = snapshot(folder)
    second = fabricate(store, "2026-01-02 00:00:00", variants=("dot-product", "linear"), ratio=3.0)
    scratch = folder.parent / "rendered"
    shutil.copytree(folder, scratch)
    render(Store(scratch / "results.sqlite"), second, scratch, keep_runs=True)
    new = snapshot(scratch)
    shutil.rmtree(scratch)
    assert old != new
    return store, second, old, new


def _board_files(files: dict) -> dict:
    return {k: v for k, v in files.items() if k != "results.sqlite"}


@pytest.mark.parametrize("failing_write", [1, 3, 6])
def test_a_full_disk_while_publishing_leaves_the_previous_board_and_no_temporary_file(tmp_path, monkeypatch, failing_write):
    import zoo.folder

    folder = tmp_path / "board"
    store, second, old, _ = _two_boards(folder)
    real, calls = zoo.folder._write_durably, []

    def fills_the_disk(path, content):
        calls.append(path)
        if len(calls) == failing_write:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(path, content)

    monkeypatch.setattr(zoo.folder, "_write_durably", fills_the_disk)
    with pytest.raises(FolderError, match="no space left on the disk holding .*the board was not written; the previous one"):
        render(store, second, folder, keep_runs=True)
    assert _board_files(snapshot(folder)) == _board_files(old)
    assert list((folder / ".zoo-cache").iterdir()) == [folder / ".zoo-cache" / "lock"]
    assert second in set(store.runs().run_id)  # the finished results stay in the store


def test_a_full_disk_while_zoo_leaderboard_publishes_is_one_line_naming_the_disk(tmp_path, monkeypatch, capsys):
    import zoo.folder

    folder = tmp_path / "board"
    _, _, old, _ = _two_boards(folder)

    def fills_the_disk(path, content):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(zoo.folder, "_write_durably", fills_the_disk)
    status, out = zoo_here(capsys, "leaderboard", "--out", folder)
    errors = [line for line in out if not line.startswith("zoo: warning:")]  # the fabricated run is not exported yet
    assert status != 0 and len(errors) == 1, out
    assert "no space left on the disk holding" in errors[0] and str(folder) in errors[0], out
    assert _board_files(snapshot(folder)) == _board_files(old)


def test_a_full_disk_while_recording_a_job_is_called_a_full_disk(tmp_path, monkeypatch):
    import sqlite3

    store = Store(tmp_path / "results.sqlite")
    run = fabricate(store, "2026-01-01 00:00:00")
    real = Store._connect

    def full(self):
        connection = real(self)
        pages = connection.execute("PRAGMA page_count").fetchone()[0]
        connection.execute(f"PRAGMA max_page_count = {pages}")
        return connection

    monkeypatch.setattr(Store, "_connect", full)
    with pytest.raises(StoreError, match="no space left on the disk holding .*; what it held before is kept") as caught:
        store.record_job(run, "linear", "speed", "done", 0.1, {}, [{"check": "c", "status": "passed", "detail": "x" * 10 ** 6}])
    assert "not a usable" not in str(caught.value)
    monkeypatch.setattr(Store, "_connect", real)
    assert sqlite3.connect(tmp_path / "results.sqlite").execute("PRAGMA integrity_check").fetchone() == ("ok",)
    assert set(store.jobs(run).suite) == {"correctness", "speed"}


KILLED_PUBLISHER = """
import os, signal, sys, time
from pathlib import Path
from zoo.leaderboard import render
from zoo.store import Store

folder, run_id, crash_at = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
if crash_at >= 0:  # die at the crash_at-th rename of the publication, the commit's most delicate moment
    real, count = os.replace, [0]
    def replace(src, dst):
        if count[0] == crash_at:
            os.kill(os.getpid(), signal.SIGKILL)
        count[0] += 1
        real(src, dst)
    os.replace = replace
store = Store(folder / "results.sqlite")
print("ready", flush=True)
started = time.perf_counter()
render(store, run_id, folder, keep_runs=True)
print(time.perf_counter() - started, flush=True)
"""


def test_a_publisher_killed_anywhere_leaves_a_board_all_old_or_all_new(tmp_path):
    """SIGKILL at 20 moments spread over a publication, and at each rename of its commit: after the next command
    opens the folder (which finishes or discards an interrupted publication) every board file is from one of them."""
    folder = tmp_path / "board"
    _, second, old, new = _two_boards(folder)
    pristine = tmp_path / "pristine"
    shutil.copytree(folder, pristine)

    def publisher(crash_at=-1):
        return subprocess.Popen([sys.executable, "-c", KILLED_PUBLISHER, str(folder), second, str(crash_at)],
                                stdout=subprocess.PIPE, text=True)

    def reset():
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)

    calibration = publisher()
    assert calibration.stdout.readline().strip() == "ready"
    duration = float(calibration.communicate(timeout=120)[0])
    outcomes = []
    for attempt in range(20):
        reset()
        process = publisher()
        assert process.stdout.readline().strip() == "ready"
        time.sleep(duration * 1.2 * attempt / 19)
        process.kill()
        process.wait(timeout=60)
        outcomes.append(_after_recovery(folder, old, new))
    for crash_at in range(len(BOARD_FILES) + 3):  # each rename of the commit (board files, plots, journal)
        reset()
        publisher(crash_at).wait(timeout=120)
        outcomes.append(_after_recovery(folder, old, new))
    assert "old" in outcomes and "new" in outcomes, outcomes


def _after_recovery(folder: Path, old: dict, new: dict) -> str:
    BoardFolder(folder).for_reading()  # what any command does first
    files = {k: v for k, v in _board_files(snapshot(folder)).items()}
    assert files in (_board_files(old), _board_files(new)), sorted(set(files.items()) ^ set(_board_files(new).items()))
    assert not [p for p in (folder / ".zoo-cache").iterdir() if p.name != "lock"]
    return "old" if files == _board_files(old) else "new"


def test_six_renderers_and_a_run_on_one_folder_at_once_all_succeed(tmp_path):
    folder = tmp_path / "board"
    published(folder)
    processes = [subprocess.Popen([sys.executable, "-m", "zoo", "leaderboard", "--out", str(folder)],
                                  stderr=subprocess.PIPE, text=True) for _ in range(6)]
    processes.append(subprocess.Popen([sys.executable, "-m", "zoo", "run", "dot-product", "--suite", "correctness",
                                       "--profile", "smoke", "--out", str(folder)], stderr=subprocess.PIPE, text=True))
    for process in processes:
        assert process.wait(timeout=300) == 0, process.stderr.read()
    assert len(exported_runs(folder)) == 2
    assert not [p for p in (folder / ".zoo-cache").iterdir() if p.name != "lock"]


def test_a_board_whose_runs_are_published_anew_while_it_is_drawn_is_drawn_again_from_them(tmp_path, capsys):
    """`zoo leaderboard` reads the runs, draws (seconds), then publishes: a run finishing in between published its
    own board and export, and the older board was put over it."""
    import zoo.leaderboard

    folder = tmp_path / "board"
    store, [first] = published(folder)
    real = zoo.leaderboard.board_files
    finished = []

    def drawn_while_a_run_finishes(*args, **kwargs):
        files = real(*args, **kwargs)
        if not finished:  # once: a run publishes its board and the export between the read and this publication
            finished.append(fabricate(store, "2026-02-01 00:00:00"))
            render(store, finished[0], folder, keep_runs=True)
        return files

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(zoo.leaderboard, "board_files", drawn_while_a_run_finishes)
        status, out = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 0 and any("were published anew while its board was drawn" in line and "drawing it again" in line
                               for line in out), out
    assert f"leaderboard for run {finished[0]} written" in out[-1], out
    assert finished[0] in (folder / "README.md").read_text() and set(exported_runs(folder)) == {first, finished[0]}


# --- the SQLite store under abuse -----------------------------------------------------------------------------


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _damaged(folder: Path) -> Path:
    import sqlite3

    store = Store(folder / "results.sqlite")
    for day in range(1, 4):
        fabricate(store, f"2026-01-0{day} 00:00:00", variants=[f"v{i}" for i in range(30)])
    with sqlite3.connect(store.path) as db:
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        page = db.execute("PRAGMA page_size").fetchone()[0]
        db.execute("PRAGMA journal_mode = DELETE")
    with open(store.path, "r+b") as handle:  # pages 2 and 3 overwritten
        handle.seek(page)
        handle.write(os.urandom(2 * page))
    return store.path


@pytest.mark.parametrize("damage", ["pages 2-3 overwritten", "0 bytes"])
def test_a_damaged_or_empty_store_is_refused_by_every_command_and_never_modified(tmp_path, capsys, damage):
    folder = tmp_path / "board"
    folder.mkdir()
    database = _damaged(folder) if damage != "0 bytes" else folder / "results.sqlite"
    if damage == "0 bytes":
        database.write_bytes(b"")
    before = _digest(database)
    elsewhere = tmp_path / "elsewhere"
    published(elsewhere)
    for args in (["leaderboard", "--out", folder], ["compare", "a", "b", "--out", folder],
                 ["prune", "--unshown", "--out", folder], ["merge", elsewhere / "results.sqlite", "--out", folder],
                 ["merge", database, "--out", elsewhere],
                 ["run", "dot-product", "--suite", "correctness", "--profile", "smoke", "--out", folder],
                 ["run-all", "--suite", "correctness", "--profile", "smoke", "--out", folder],
                 ["run-all", "--resume", "--out", folder]):
        status, out = zoo_here(capsys, *args)
        assert status == 2 and len(out) == 1 and "results.sqlite" in out[0], (args, out)
        assert ("damaged" if damage != "0 bytes" else "is empty (0 bytes)") in out[0], out
    assert _digest(database) == before
    assert not database.with_name("results.sqlite-wal").exists()


@contextlib.contextmanager
def read_only_view(source: Path, view: Path):
    """``source`` seen through a read-only bind mount: read-only media, where even root cannot write."""
    view.mkdir()
    mounted = subprocess.run(["mount", "--bind", str(source), str(view)], capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"a read-only view needs a bind mount, which this machine refuses ({mounted.stderr.strip()})")
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(view)], check=True, capture_output=True)
        yield view
    finally:
        subprocess.run(["umount", str(view)], check=True)


def test_a_store_on_read_only_media_is_read_and_never_written(tmp_path, capsys):
    """A WAL store where no WAL index can be made: merge and compare read it, leaderboard says it cannot write."""
    published(tmp_path / "board")
    for leftover in (tmp_path / "board").glob("results.sqlite-*"):
        leftover.unlink()
    before = snapshot(tmp_path / "board")
    with read_only_view(tmp_path / "board", tmp_path / "media") as media:
        status, out = zoo_here(capsys, "merge", media / "results.sqlite", "--out", tmp_path / "target")
        assert status == 0 and out == [f"zoo: merged 1 run(s) from {media / 'results.sqlite'}"], out
        run = Store(tmp_path / "target" / "results.sqlite").latest_run()
        assert zoo_here(capsys, "compare", run, run, "--out", media)[0] == 0
        status, out = zoo_here(capsys, "leaderboard", "--out", media)
        assert status == 2 and out == [f"zoo: error: --out: cannot write to {str(media)!r} (not writable)"], out
    assert snapshot(tmp_path / "board") == before


def test_a_read_only_scratch_folder_lets_reading_commands_read_and_a_writing_one_names_it(tmp_path, capsys):
    """.zoo-cache on read-only media (the folder itself writable): nothing can stage a publication there, so a
    command that only reads needs no lock and reads; one that publishes names the lock it cannot write."""
    folder = tmp_path / "board"
    _, [run] = published(folder)
    shutil.move(folder / ".zoo-cache", tmp_path / "scratch")
    before = snapshot(folder)
    with read_only_view(tmp_path / "scratch", folder / ".zoo-cache"):
        assert zoo_here(capsys, "compare", run, run, "--out", folder)[0] == 0
        status, out = zoo_here(capsys, "leaderboard", "--out", folder)
        assert status == 2 and out == [f"zoo: error: --out: cannot write {str(folder / '.zoo-cache' / 'lock')!r} "
                                       "(Read-only file system): a publication takes the lock .zoo-cache/lock and "
                                       "stages its files in .zoo-cache; nothing was written"], out
    assert snapshot(folder) == before


def test_a_store_on_read_only_media_whose_log_holds_runs_is_read_with_them(tmp_path, capsys):
    """Copied without its -shm (a killed run's store, taken to another machine): on read-only media SQLite can read
    the file alone, without the runs still in its write-ahead log; the merge reads both (from a copy) and takes
    every run, and the media is not written."""
    source = tmp_path / "board"
    script = ("import os, sqlite3, sys; from pathlib import Path; from test_nothing_lost import fabricate; "
              "from zoo.store import Store; path = Path(sys.argv[1]); store = Store(path); "
              "fabricate(store, '2026-01-01 00:00:00'); keep = sqlite3.connect(path); "
              "keep.execute('PRAGMA wal_autocheckpoint=0'); keep.execute('SELECT 1 FROM runs').fetchall(); "
              "fabricate(store, '2026-01-02 00:00:00'); os._exit(0)")  # exits holding the log: nothing folds it in
    done = subprocess.run([sys.executable, "-c", script, str(source / "results.sqlite")], capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parent)})
    assert done.returncode == 0, done.stderr
    (source / "results.sqlite-shm").unlink()
    assert (source / "results.sqlite-wal").stat().st_size > 0
    before = snapshot(source)
    with read_only_view(source, tmp_path / "media") as media:
        status, out = zoo_here(capsys, "merge", media / "results.sqlite", "--out", tmp_path / "target")
        assert status == 0 and out == [f"zoo: merged 2 run(s) from {media / 'results.sqlite'}"], out
    assert set(exported_runs(tmp_path / "target")) == set(Store(source / "results.sqlite", readonly=True).records())
    assert snapshot(source) == before


def test_a_merge_of_a_different_copy_of_a_run_is_refused_and_names_it(tmp_path, capsys):
    folder, other = tmp_path / "board", tmp_path / "other"
    store, [run] = published(folder)
    shutil.copytree(folder, other)
    Store(other / "results.sqlite").record_job(run, "linear", "speed", "done", 0.1, {}, [])
    before = snapshot(folder)
    status, out = zoo_here(capsys, "merge", other / "results.sqlite", "--out", folder)
    assert status == 2 and len(out) == 1 and f"{run!r}" in out[0] and "nothing was merged" in out[0], out
    assert snapshot(folder) == before
    status, out = zoo_here(capsys, "merge", folder / "results.sqlite", "--out", other)
    assert status == 2
    status, out = zoo_here(capsys, "merge", folder / "runs.jsonl", "--out", folder)  # itself: nothing new
    assert status == 0 and out == [f"zoo: merged 0 run(s) from {folder / 'runs.jsonl'} (1 already here)"]


def test_a_merge_draws_the_board_again_so_a_newer_run_merged_is_the_one_it_shows(tmp_path, capsys):
    """The board shows its folder's runs as they are after a merge: a newer run of the board's machine merged
    from elsewhere becomes the run its files show, without a `zoo leaderboard` after it."""
    folder, other = tmp_path / "board", tmp_path / "other"
    published(folder)
    newer = fabricate(Store(other / "results.sqlite"), "2026-01-02 00:00:00", ratio=2.0)
    status, lines = zoo_here(capsys, "merge", other / "results.sqlite", "--out", folder)
    assert status == 0 and lines[-1] == f"zoo: leaderboard for run {newer} written to {folder / 'README.md'}", lines
    assert newer in (folder / "README.md").read_text() and newer in set(pd.read_csv(folder / "results.csv").run_id)


# --- one validation for the CLI and the Python API ------------------------------------------------------------


@pytest.mark.parametrize("options, message", [
    ({"repeats": 0}, "--repeats: must be a positive integer, got 0"),
    ({"threads": -1}, "--threads: must be a positive integer, got -1"),
    ({"timeout": -5}, "--timeout: must be more than 0, got -5"),
    ({"memory_limit_gib": float("nan")}, "--memory-limit: must be a finite number, got nan"),
    ({"memory_limit_gib": 0.0001}, "--memory-limit: must be more than 1, got 0.0001"),
    ({"lengths": "1024"}, "--lengths: expected a list of integers, got '1024'"),
    ({"lengths": [256, "512"]}, "--lengths: expected a list of integers"),
    ({"suites": [None]}, "--suite: expected a name or a list of names, got [None]"),
    ({"variants": 5}, "variants: expected a name or a list of names, got 5"),
    ({"options": ["window"]}, "--option: expected a mapping"),
    ({"address": "host:1"}, "--address: only used with --executor ray"),
])
def test_the_python_api_refuses_what_the_cli_refuses_before_anything_is_written(tmp_path, options, message):
    out = tmp_path / "never-made"
    with pytest.raises(zoo.ZooError, match="^" + message.replace("[", r"\[").replace("(", r"\(")):
        zoo.run(**{"variants": ["dot-product"], **options}, out=out, profile="smoke")
    assert not out.exists()


@pytest.mark.parametrize("options, message", [
    ({"out": None}, "--out: expected a folder, got None"),
    ({"out": 5}, "--out: expected a folder, got 5"),
    ({"variants": []}, "variants: expected a name or a list of names, got []"),
    ({"suites": []}, "--suite: expected a name or a list of names, got []"),
    ({"lengths": {256: 1}}, "--lengths: expected a list of integers, got {256: 1}"),
    ({"memory_limit_gib": 1e10}, "--memory-limit: 10000000000.0 GiB is more address space than a process can be given"),
])
def test_the_python_api_refuses_empty_selections_and_impossible_values(tmp_path, options, message):
    with pytest.raises(zoo.ZooError, match="^" + message.replace("[", r"\[").replace("{", r"\{").replace("(", r"\(")):
        zoo.run(**{"variants": ["dot-product"], "out": tmp_path / "never-made", **options}, profile="smoke")
    assert not (tmp_path / "never-made").exists()


def test_the_cli_refuses_a_memory_cap_no_worker_can_start_under(tmp_path):
    done = run_zoo("run", "dot-product", "--memory-limit", "0.0001", "--out", tmp_path)
    assert done.returncode == 2 and done.stderr.strip().splitlines() == [
        "zoo: error: --memory-limit: must be more than 1, got 0.0001 (GiB: a worker needs about 1 GiB of address "
        "space to start torch)"]


def test_one_name_is_one_variant_and_a_crash_under_a_memory_cap_names_the_cap(tmp_path):
    from zoo.runner import RunOptions, _failure_reason

    results = zoo.run("dot-product", suites="correctness", profile="smoke", out=tmp_path)
    assert set(results.variant) == {"dot-product"} and set(results.suite) == {"correctness"}
    options = RunOptions(profile=None, timeout_seconds=1, memory_limit_bytes=2 ** 20)
    kind, reason = _failure_reason(-signal.SIGSEGV, False, options, tmp_path / "no-log")
    assert kind == "crashed"
    assert reason == "worker crashed with signal SIGSEGV (it ran under a memory cap of 0.000977 GiB, --memory-limit)"


def test_inputs_of_a_wrong_dtype_or_device_name_the_variant_and_the_input():
    import torch

    layer = zoo.create("dot-product", d_model=8, num_heads=2)
    x = torch.randn(1, 4, 8)
    with pytest.raises(zoo.contract.VariantInputError, match="variant 'dot-product': query must be a floating-point tensor, got torch.int64"):
        layer(x.long(), x, x)
    with pytest.raises(zoo.contract.VariantInputError, match="query, key and value must have one dtype, got torch.float32, torch.float64"):
        layer(x, x.double(), x)
    with pytest.raises(zoo.contract.VariantInputError, match="must be on one device, got cpu, meta"):
        layer(x, x.to("meta"), x)
    with pytest.raises(zoo.contract.VariantInputError, match="attn_mask must be on the inputs' device"):
        layer(x, x, x, attn_mask=torch.ones(4, 4, dtype=torch.bool, device="meta"))
    with pytest.raises(zoo.ZooError, match="a variant name must be a string, got None"):
        zoo.create(None, d_model=8)
    layer = zoo.create("multi-head", d_model=8, num_heads=2)
    with pytest.raises(zoo.contract.VariantInputError, match="variant 'multi-head': the inputs are torch.float64 but "
                                                             "the module's in_proj_weight is torch.float32"):
        layer(x.double(), x.double(), x.double())
    with pytest.raises(zoo.contract.VariantInputError, match="variant 'performer': the inputs are on meta but the "
                                                             "module's projection is on cpu"):
        zoo.create("performer", d_model=8, num_heads=2)(*(x.to("meta"),) * 3)


# --- signals and pipes ----------------------------------------------------------------------------------------


def test_sigterm_stops_a_run_like_ctrl_c_and_resume_finishes_it(tmp_path):
    args = [sys.executable, "-m", "zoo", "run", "dot-product", "linear", "multi-head", "--suite", "correctness",
            "--profile", "smoke", "--out", str(tmp_path)]
    process = subprocess.Popen(args, stderr=subprocess.PIPE, text=True)
    assert process.stderr.readline().startswith("zoo: run ")
    # one job finished and recorded (correctness jobs run two at a time: either of the first two may end first)
    finished = process.stderr.readline().split()
    assert finished[0] == "[1/3]" and finished[1] in ("dot-product", "linear"), finished
    process.send_signal(signal.SIGTERM)
    rest = process.communicate(timeout=120)[1].strip().splitlines()
    assert process.returncode == 128 + signal.SIGTERM, rest
    assert rest[-1] == "zoo: interrupted (SIGTERM); finished jobs are kept (zoo run-all --resume continues)", rest
    assert not any("Traceback" in line for line in rest)
    store = Store(tmp_path / "results.sqlite")
    run = store.latest_run(unfinished=True)
    assert finished[1] in set(store.jobs(run).variant)
    resumed = run_zoo(*[a for a in args[3:] if a not in ("--profile", "smoke")], "--resume")
    assert resumed.returncode == 0, resumed.stderr
    assert set(store.jobs(run).variant) == {"dot-product", "linear", "multi-head"}


def test_a_closed_stdout_ends_quietly():
    read, write = os.pipe()
    os.close(read)  # as `| head` does once it has its lines
    done = subprocess.run([sys.executable, "-m", "zoo", "show", "windowed"], stdout=write, stderr=subprocess.PIPE,
                          text=True, timeout=120)
    os.close(write)
    assert done.returncode == 128 + signal.SIGPIPE and done.stderr == "", done.stderr


def test_a_closed_or_full_stdout_and_a_file_where_a_folder_belongs_are_one_line(tmp_path, capsys):
    closed = subprocess.run(f"{sys.executable} -m zoo show windowed >&-", shell=True, capture_output=True, text=True)
    assert closed.returncode == 0 and closed.stderr == "", closed.stderr
    full = subprocess.run([sys.executable, "-m", "zoo", "show", "windowed"], stdout=open("/dev/full", "w"),
                          stderr=subprocess.PIPE, text=True)
    assert full.returncode == 2 and full.stderr.splitlines() == ["zoo: error: No space left on device (writing the output)"]
    a_file = tmp_path / "a-file"
    a_file.write_text("")
    for args in (["leaderboard", "--out", a_file], ["merge", tmp_path, "--out", tmp_path / "b"],
                 ["new", "ok-name", "--dir", a_file / "inside"]):
        status, out = zoo_here(capsys, *args)
        assert status == 2 and len(out) == 1 and "Traceback" not in out[0], (args, out)
    assert "is a file, not a folder" in zoo_here(capsys, "run", "dot-product", "--out", a_file)[1][0]


def test_an_export_that_is_a_link_or_a_pipe_is_refused_and_one_of_another_name_merges(tmp_path, capsys):
    folder = tmp_path / "board"
    published(folder)
    (folder / "results.sqlite").unlink()
    shutil.move(folder / "runs.jsonl", tmp_path / "theirs.json")
    (folder / "runs.jsonl").symlink_to(tmp_path / "theirs.json")
    status, out = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 2 and "a symbolic link" in out[0], out
    (folder / "runs.jsonl").unlink()
    os.mkfifo(folder / "runs.jsonl")
    status, out = zoo_here(capsys, "leaderboard", "--out", folder)
    assert status == 2 and "runs.jsonl: not a regular file" in out[0], out
    status, out = zoo_here(capsys, "merge", tmp_path / "theirs.json", "--out", tmp_path / "other")
    assert status == 0 and out == [f"zoo: merged 1 run(s) from {tmp_path / 'theirs.json'}"], out


def test_a_run_stored_before_settings_were_nested_shares_a_board_with_a_new_run_that_measures_the_same_way(tmp_path):
    """Runs are grouped by their settings as read back, not as stored: a new run of a variant the old run left out
    joins that run's board instead of hiding it."""
    from zoo.api import default_registry
    from zoo.board import board_group
    from zoo.profiles import PROFILES, resolve

    store = Store(tmp_path / "results.sqlite")
    flat = {"name": "full", "speed_lengths": [4096, 8192], "complexity_lengths": [4096, 8192], "repeats": 3}
    old = fabricate(store, "2026-01-01 00:00:00", settings=flat)
    lengths = {"speed": {"lengths": (4096, 8192), "repeats": 3}, "complexity": {"lengths": (4096, 8192)}}
    suites = default_registry().suites
    same = resolve(PROFILES["full"].with_overrides(processes=1), suites, lengths)
    new = fabricate(store, "2026-01-02 00:00:00", variants=("linear",), settings=same.as_dict())
    more_rounds = resolve(PROFILES["full"].with_overrides(processes=1), suites, {**lengths, "speed": {"repeats": 4}})
    other = fabricate(store, "2026-01-03 00:00:00", settings=more_rounds.as_dict())
    assert board_group(store, old) == board_group(store, new) != board_group(store, other)


def _lock_taken_elsewhere(folder: Path) -> bool:
    """Whether another open file of the folder's lock holds it now (flock: another description blocks)."""
    import fcntl

    with open(folder / ".zoo-cache" / "lock", "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(handle, fcntl.LOCK_UN)
        return False


def test_a_reader_takes_the_export_and_the_database_under_the_lock_a_publication_holds(tmp_path, monkeypatch):
    """Read apart, a run published between the two (a resumed run's new rows) made the export and the database
    disagree about it: a false conflict, exit 2, for a command that only reads. Read under the folder's lock,
    they are one publication's. So is a sub-board's plot, read for the parent board's page: a publication there
    removing it between listing and reading failed the parent's render."""
    import zoo.folder

    folder = tmp_path / "board"
    folder.mkdir()
    _two_boards(folder)
    held = []
    reading = zoo.folder.export_file_bytes
    monkeypatch.setattr(zoo.folder, "export_file_bytes", lambda path: held.append(_lock_taken_elsewhere(folder))
                        or reading(path))
    copying = Store.copy_to_memory
    monkeypatch.setattr(Store, "copy_to_memory", lambda store: held.append(_lock_taken_elsewhere(folder))
                        or copying(store))
    BoardFolder(folder).for_reading()
    assert held == [True, True]
    held.clear()
    reading_png = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda path: (held.append(_lock_taken_elsewhere(folder))
                                                          if path.suffix == ".png" else None) or reading_png(path))
    plots = BoardFolder(folder).published("*.png")
    assert plots and set(plots) == {p.name for p in folder.glob("*.png")} and held == [True] * len(plots)
    held.clear()  # the page of a board whose subfolder is this one
    from zoo.leaderboard import _sub_board_plots

    assert len(_sub_board_plots(tmp_path)) == len(plots) and held == [True] * len(plots)


def test_a_board_with_two_carried_suites_shows_the_rows_each_carries(tmp_path):
    """A plugin may register a carried suite beside the quality suite; the board reads each suite's carried rows
    whether or not the other had stale ones to drop (an empty frame of dropped jobs once broke the next suite)."""
    from zoo.board import Board
    from zoo.leaderboard import registered_suites

    store = Store(tmp_path / "results.sqlite")
    trained = store.start_run({"name": "full", "reference_length": 64}, {"device": "cpu", "cpu": "test"},
                              "2026-01-01 00:00:00")
    store.record_job(trained, "dot-product", "trained", "done", 0.1, {"plugin": "test"},
                     [{"check": "accuracy", "status": "measured", "value": 0.9}])
    store.finish_run(trained, "2026-01-01 00:00:00")
    latest = fabricate(store, "2026-01-02 00:00:00")
    suites = {**registered_suites(), "trained": zoo.Suite("trained", "kept from the run that trained them",
                                                          profiles=("full",), carried=True)}
    board = Board.of(store, latest, suites)
    assert list(board.carried["trained"].run_id) == [trained] and "quality" not in board.carried
