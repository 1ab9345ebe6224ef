"""The results store: interrupted runs keep finished jobs, --resume finishes them, concurrent writers."""

import multiprocessing
import signal
import sqlite3
import textwrap

import pandas as pd

from conftest import KILL_THE_RUNNER, good_plugin, run_zoo
from zoo.folder import BoardFolder
from zoo.store import Store

NAMES = ["dot-product", "linear"]

# A variant that kills the runner the first time it is called, as kill -9 would.
RUNNER_KILLER = good_plugin("zz-killer", before=f"""
    import os
    if not os.path.exists(MARKER):
        open(MARKER, "w").close()
{textwrap.indent(KILL_THE_RUNNER, "        ")}""")


def _run(out, *extra, plugins=None):
    names = [*NAMES, "zz-killer"] if plugins else NAMES
    profile = [] if "--resume" in extra else ["--profile", "smoke"]  # a resumed run keeps its own settings
    args = ["run", *names, "--suite", "correctness", *profile, "--out", out, *extra]
    return run_zoo(*args, *(["--plugins-dir", plugins] if plugins else []), timeout=300)


def test_killed_run_keeps_finished_jobs_and_resume_completes_it(tmp_path, write_plugin):
    out, marker = tmp_path / "out", tmp_path / "killed-once"
    plugins = write_plugin("killer", f"MARKER = {str(marker)!r}\n" + RUNNER_KILLER)
    killed = _run(out, plugins=plugins)
    assert killed.returncode == -signal.SIGKILL and marker.exists()
    store = Store(out / "results.sqlite")
    run = store.latest_run(unfinished=True)
    before = store.jobs(run).set_index(["variant", "suite"]).seconds
    # the variant the killer's lane ran before it finished and was kept (the other lane's may have been stopped by
    # the kill: correctness jobs run two at a time, each lane taking the next variant when it is free)
    assert 1 <= len(before) <= 2 and ("zz-killer", "correctness") not in before.index

    resumed = _run(out, "--resume", plugins=plugins)
    assert resumed.returncode == 0, resumed.stderr
    assert f"run {run}" in resumed.stderr
    after = store.jobs(run).set_index(["variant", "suite"]).seconds
    assert len(after) == 3 and store.latest_run(unfinished=True) is None

    for key in before.index:  # finished jobs were not redone
        assert after[key] == before[key]
    assert (out / "README.md").exists()


def _write_many(path, worker):
    store = Store(path)
    run = store.start_run({"name": "test"}, {"worker": str(worker)}, f"2026-01-01 00:00:0{worker}")
    for index in range(40):
        rows = [{"check": "c", "status": "measured", "value": float(index), "n": index} for _ in range(20)]
        store.record_job(run, f"v{index}", "s", "done", 0.1, {"plugin": "p"}, rows)


def test_concurrent_writers_do_not_corrupt_the_database(tmp_path):
    path = tmp_path / "results.sqlite"
    Store(path).runs()  # create the schema once
    workers = [multiprocessing.Process(target=_write_many, args=(path, w)) for w in range(3)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    with sqlite3.connect(path) as db:
        assert db.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
        assert db.execute("SELECT COUNT(*) FROM jobs").fetchone()[0] == 3 * 40
        assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 3 * 40 * 20


def test_resume_without_an_unfinished_run_is_a_clear_error(tmp_path):
    out = run_zoo("run-all", "--resume", "--out", tmp_path, timeout=60)
    assert out.returncode == 2 and "--resume: no run to continue in" in out.stderr
    assert list(tmp_path.iterdir()) == []  # and no database made for it


def test_runs_from_several_machines_merge_and_render_one_leaderboard_per_device(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    here, there = Store(tmp_path / "a" / "results.sqlite"), Store(tmp_path / "b" / "results.sqlite")
    for store, environment, ratio in ((here, {"device": "cpu", "cpu": "AMD EPYC"}, 1.25),
                                      (there, {"device": "cuda (NVIDIA H200)"}, 0.75)):
        run = store.start_run({"name": "quick", "reference_length": 64}, environment, "2026-01-01 00:00:00")
        store.record_job(run, "dot-product", "correctness", "done", 0.1, {"plugin": "dot_product", "card": {}},
                         [{"check": "reference-float64", "status": "passed", "setting": "s"}])
        store.record_job(run, "dot-product", "speed", "done", 0.1, {"plugin": "dot_product", "card": {}},
                         [{"check": "x-torch-sdpa", "status": "measured", "value": ratio, "n": 64, "mode": "full",
                           "phase": "fwd+bwd"}])
    merged = run_zoo("merge", tmp_path / "b" / "results.sqlite", "--out", tmp_path / "a", timeout=60)
    assert merged.returncode == 0 and "merged 1 run" in merged.stderr
    assert len(here.runs()) == 2
    again = run_zoo("merge", tmp_path / "b" / "results.sqlite", "--out", tmp_path / "a", timeout=60)
    assert "merged 0 run" in again.stderr and len(here.runs()) == 2
    rendered = run_zoo("leaderboard", "--by", "device", "--out", tmp_path / "a", timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    index = (tmp_path / "a" / "by-device" / "README.md").read_text()
    assert "cpu: AMD EPYC" in index and "cuda (NVIDIA H200)" in index
    side_by_side = index.split("## Side by side", 1)[1]
    assert "| dot-product" in side_by_side and "1.25x" in side_by_side and "0.75x" in side_by_side
    assert len(list((tmp_path / "a" / "by-device").glob("*/README.md"))) == 2


def test_jobs_that_ran_elsewhere_are_filed_under_their_own_device(tmp_path):
    """On a Ray cluster a job may run on another machine than the one that started the run."""
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run({"name": "quick"}, {"device": "cuda (unavailable)", "cpu": "laptop"}, "2026-01-01 00:00:00")
    gpu_node = {"host": "node-7", "cpu": "Xeon", "device": "cuda (NVIDIA H200)"}
    store.record_job(run, "dot-product", "speed", "done", 1.0, {"card": {}, "ran_on": gpu_node}, [])
    assert store.device_kinds(run) == ["cuda (NVIDIA H200)"]
    store.record_job(run, "linear", "speed", "done", 1.0, {"card": {}}, [])  # an older record: the run's own
    assert store.device_kinds(run) == ["cuda (NVIDIA H200)", "cuda (unavailable)"]


def test_a_fresh_checkout_rebuilds_the_board_and_keeps_accumulating_from_the_committed_export(tmp_path):
    import shutil

    import pandas as pd

    out, fresh = tmp_path / "out", tmp_path / "fresh"
    assert _run(out).returncode == 0
    assert run_zoo("run", "linear", "--suite", "correctness", "--profile", "smoke", "--out", out, timeout=300).returncode == 0
    original = Store(out / "results.sqlite")
    runs = list(original.runs().run_id)
    board = (out / "README.md").read_text()
    assert all(run in board for run in runs)  # dot-product's rows are from the first run, linear's from the second
    shutil.copytree(out, fresh, ignore=shutil.ignore_patterns("results.sqlite*"))  # what git holds

    rendered = run_zoo("leaderboard", "--out", fresh, timeout=120)
    assert rendered.returncode == 0, rendered.stderr
    assert (fresh / "README.md").read_text() == board
    assert (fresh / "runs.jsonl").read_bytes() == (out / "runs.jsonl").read_bytes()
    assert not (fresh / "results.sqlite").exists()  # a command that only reads writes no database either
    rebuilt = BoardFolder(fresh).for_reading()
    for run in runs:
        pd.testing.assert_frame_equal(rebuilt.results(run), original.results(run))
        pd.testing.assert_frame_equal(rebuilt.jobs(run), original.jobs(run))
        assert rebuilt.settings(run) == original.settings(run) and rebuilt.environment(run) == original.environment(run)

    shutil.rmtree(fresh)
    shutil.copytree(out, fresh, ignore=shutil.ignore_patterns("results.sqlite*"))
    assert run_zoo("run", "linear", "--suite", "correctness", "--profile", "smoke", "--out", fresh, timeout=300).returncode == 0
    again = Store(fresh / "results.sqlite")
    assert set(runs) < set(again.runs().run_id)  # the new run was added to the imported ones
    assert runs[0] in (fresh / "README.md").read_text()  # dot-product still shown, from the committed first run


def _open_for_writing(folder):
    BoardFolder(folder).for_writing()


def test_processes_opening_a_fresh_folder_at_once_add_its_exported_runs_once(tmp_path):
    from zoo.export import export_bytes

    source = Store(tmp_path / "a.sqlite")
    ids = [source.start_run({"name": "test"}, {}, f"2026-01-01 00:00:0{i}") for i in range(3)]
    for run in ids:
        source.record_job(run, "v", "s", "done", 0.1, {}, [{"check": "c", "status": "measured", "value": 1.0}] * 50)
    folder = tmp_path / "fresh"
    folder.mkdir()
    (folder / "runs.jsonl").write_bytes(export_bytes(source.records().values()))
    workers = [multiprocessing.Process(target=_open_for_writing, args=(folder,)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
        assert w.exitcode == 0
    with sqlite3.connect(folder / "results.sqlite") as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 3
        assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 3 * 50


def _add_the_same_runs(path, records, barrier):
    barrier.wait()  # all at once
    for _ in range(5):
        Store(path).add(records, only_new=True)


def test_processes_adding_the_same_runs_at_once_add_each_once_without_an_error(tmp_path):
    """Which runs are new is decided inside the writing transaction, so no two writers both decide to insert."""
    source = Store(tmp_path / "a.sqlite")
    ids = [source.start_run({"name": "test"}, {}, f"2026-01-01 00:00:0{i}") for i in range(6)]
    for run in ids:
        source.record_job(run, "v", "s", "done", 0.1, {}, [{"check": "c", "status": "measured", "value": 1.0}] * 200)
    records = list(source.records().values())
    target = tmp_path / "b.sqlite"
    Store(target).check()
    barrier = multiprocessing.Barrier(4)
    workers = [multiprocessing.Process(target=_add_the_same_runs, args=(target, records, barrier)) for _ in range(4)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert w.exitcode == 0
    with sqlite3.connect(target) as db:
        assert db.execute("SELECT COUNT(*) FROM runs").fetchone()[0] == 6
        assert db.execute("SELECT COUNT(*) FROM results").fetchone()[0] == 6 * 200


def test_a_runs_rows_read_for_some_suites_are_exactly_theirs(tmp_path):
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run({"name": "quick"}, {"cpu": "laptop"}, "2026-01-01 00:00:00")
    for suite, values in (("speed", [1.0, 2.0]), ("correctness", [3.0]), ("inference", [4.0])):
        store.record_job(run, "v", suite, "done", 1.0, {"card": {}},
                         [{"check": "c", "status": "measured", "value": value} for value in values])
    every = store.results(run)
    some = store.results(run, ["speed", "inference"])
    assert sorted(some.value) == [1.0, 2.0, 4.0]
    pd.testing.assert_frame_equal(some.reset_index(drop=True),
                                  every[every.suite.isin(["speed", "inference"])].reset_index(drop=True))
    assert store.results(run, []).empty
