"""`zoo run-all` end to end on the smoke profile: results, leaderboard files, and isolation of bad plugins."""

import json

import pandas as pd
import pytest

from conftest import good_plugin, run_zoo
from zoo.profiles import get_profile
from zoo.store import Store

LEAKS_FUTURE = good_plugin("leaks-future", causal="False")  # ignores is_causal: a deliberate bug
CRASHES = good_plugin("crashes", before="import os; os._exit(3)")
HANGS = good_plugin("hangs", before="import time; time.sleep(600)")
FACTORY_RAISES = good_plugin("factory-raises", init="raise RuntimeError('cannot build')")

MISBEHAVING = {
    "forward-raises": good_plugin("forward-raises", before="raise ValueError('forward is broken')"),
    "wrong-shape": good_plugin("wrong-shape", output="out[:, :1]"),
    "wrong-dtype": good_plugin("wrong-dtype", output="out.half()"),
    "gives-nan": good_plugin("gives-nan", output="out * float('nan')"),
    "segfaults": good_plugin("segfaults", before="import ctypes; ctypes.string_at(0)"),
    "over-memory": good_plugin("over-memory", before="import torch; torch.ones(2 ** 31)"),
    "chatty": "print('{\"type\": \"job\", garbage')\n" + good_plugin("chatty", before="print('not json {{{')"),
}


def run_all(tmp_path, *args, timeout=300):
    return run_zoo("run-all", "--profile", "smoke", "--out", tmp_path / "out", *args, timeout=timeout)


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    """One smoke run: dot-product, a variant that leaks the future, and three that misbehave."""
    tmp_path = tmp_path_factory.mktemp("run")
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    sources = {"leaks": LEAKS_FUTURE, "crashes": CRASHES, "raises": FACTORY_RAISES,
               **{name.replace("-", "_"): source for name, source in MISBEHAVING.items()}}
    for name, source in sources.items():
        (plugins / f"{name}.py").write_text(source)
    names = ["dot-product", "leaks-future", "crashes", "factory-raises", *MISBEHAVING]
    out = run_all(tmp_path, "--plugins-dir", plugins, "--memory-limit", 4, "--suite", "correctness",
                  *[arg for name in names for arg in ("--filter", name)])
    return out, tmp_path / "out"


def test_run_completes_and_writes_the_three_kinds_of_output(finished_run):
    out, folder = finished_run
    assert out.returncode == 0, out.stderr
    assert (folder / "README.md").exists() and (folder / "results.csv").exists()
    results = pd.read_csv(folder / "results.csv")
    assert {"variant", "suite", "check", "setting", "status", "value", "unit", "detail"} <= set(results.columns)
    assert set(results.variant) == {"dot-product", "leaks-future", "crashes", "factory-raises", *MISBEHAVING}


def test_broken_variant_fails_with_its_reason_while_the_good_one_ranks(finished_run):
    _, folder = finished_run
    results = pd.read_csv(folder / "results.csv")
    leak = results[(results.variant == "leaks-future") & (results.check == "causal-leak")]
    assert (leak.status == "failed").any() and leak.detail.str.contains("future tokens").any()
    good = results[(results.variant == "dot-product") & (results.suite == "correctness")]
    assert set(good.status) <= {"passed", "skipped"}
    readme = (folder / "README.md").read_text()
    ranked = readme.split("## Leaderboard")[1].split("### Not ranked")[0]
    assert "| dot-product" in ranked and "leaks-future" not in ranked
    assert "**leaks-future**" in readme and "causal-leak" in readme


@pytest.mark.parametrize("variant, reason", [
    ("crashes", "worker exited with status 3"),
    ("factory-raises", "cannot build"),
    ("forward-raises", "forward is broken"),
    ("wrong-shape", "expected (batch, q_len, d_model)"),
    ("wrong-dtype", "dtype and device must be preserved"),
    ("gives-nan", "non-finite (NaN/inf) output"),
    ("segfaults", "worker crashed with signal SIGSEGV"),
    ("over-memory", "beyond the worker's memory cap of 4.0 GiB"),
])
def test_misbehaving_plugins_get_error_rows_with_a_reason(finished_run, variant, reason):
    _, folder = finished_run
    results = pd.read_csv(folder / "results.csv")
    errors = results[(results.variant == variant) & (results.status == "error")]
    assert not errors.empty and errors.detail.str.contains(reason, regex=False).any(), errors.detail.tolist()


def test_a_plugin_printing_garbage_to_stdout_changes_nothing(finished_run):
    _, folder = finished_run
    results = pd.read_csv(folder / "results.csv")
    chatty = results[results.variant == "chatty"]
    assert not chatty.empty and set(chatty.status) <= {"passed", "skipped"}


def test_every_bad_variant_is_explained_on_the_leaderboard(finished_run):
    _, folder = finished_run
    readme = (folder / "README.md").read_text()
    for name in ["leaks-future", "crashes", "factory-raises", "forward-raises", "wrong-shape",
                 "wrong-dtype", "gives-nan", "segfaults", "over-memory"]:
        assert f"**{name}**" in readme


def test_a_hanging_variant_is_stopped_at_the_timeout_and_explained(tmp_path):
    """Alone, with a short limit: if a busy machine makes the worker's start slower than the limit, the
    verdict is the same (timed out), so no clock decides the outcome."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "hangs.py").write_text(HANGS)
    out = run_all(tmp_path, "--plugins-dir", plugins, "--timeout", 5, "--suite", "correctness", "--filter", "hangs")
    assert out.returncode == 0, out.stderr
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    errors = results[(results.variant == "hangs") & (results.status == "error")]
    assert errors.detail.str.contains("timed out").any(), errors.detail.tolist()
    assert "**hangs**" in (tmp_path / "out" / "README.md").read_text()


STALLS = good_plugin("stalls") + '''

def _stall(variant, profile):
    import time

    time.sleep(600)
    yield zoo.Result("never", "measured")


@zoo.hookimpl
def zoo_register_checks(register):
    register(zoo.Check("stall", "slow", "a check that never finishes", _stall))
'''


def test_a_job_that_times_out_costs_only_its_suite_and_does_not_unrank_a_correct_variant(tmp_path):
    """The time limit is each job's: the slow suite's job is stopped and says so, the variant's correctness
    (run before it) and the job after it in the same variant's worker still land, and the variant is ranked."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "stalls.py").write_text(STALLS)
    out = run_all(tmp_path, "--plugins-dir", plugins, "--timeout", 60, "--suite", "correctness", "--suite", "slow",
                  "--suite", "complexity", "--filter", "stalls")
    assert out.returncode == 0, out.stderr
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    stalled = results[(results.suite == "slow")]
    assert list(stalled.status) == ["error"] and "timed out: the job took longer than the limit of 60 s" in stalled.detail.iloc[0]
    assert json.loads(stalled.params.iloc[0]) == {"unfinished": "timed out"}  # typed: what a board's cell says
    assert {"correctness", "complexity"} <= set(results[results.status != "error"].suite)  # the job after it ran too
    [line] = [line for line in out.stderr.splitlines() if " slow " in line and "checks" in line]
    assert "[....................] 0/1 checks" in line and "ERROR: timed out" in line, line  # how far it got
    assert float(line.split("checks")[1].split(" s ")[0]) >= 60, line  # and how long it ran
    readme = (tmp_path / "out" / "README.md").read_text()
    assert "| stalls" in readme.split("## Leaderboard")[1].split("## Capabilities")[0].split("### Not ranked")[0]


def test_speed_and_complexity_of_a_good_variant_render(tmp_path):
    out = run_all(tmp_path, "--filter", "dot-product")
    assert out.returncode == 0, out.stderr
    folder = tmp_path / "out"
    batches = get_profile("smoke").of("inference").batches
    assert {p.name for p in folder.glob("*.png")} == {"time.png", "flops.png", "memory.png",
                                                      *(f"decode-time-batch{b}.png" for b in batches)}
    readme = (folder / "README.md").read_text()
    assert "| dot-product" in readme.split("## Leaderboard")[1].split("## Correctness")[0]


def test_leaderboard_rerenders_from_the_database_for_a_run_named_by_a_unique_prefix(finished_run, capsys):
    from zoo.cli import main

    _, folder = finished_run
    run_id = Store(folder / "results.sqlite").latest_run()
    (folder / "README.md").unlink()
    out = run_zoo("leaderboard", "--out", folder, "--run", run_id[:-3], timeout=120)
    assert out.returncode == 0 and (folder / "README.md").exists() and f"for run {run_id} " in out.stderr
    assert main(["leaderboard", "--out", str(folder), "--run", "nope"]) == 2
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "--run: run 'nope' matches 0 runs" in line and run_id in line


def test_cuda_workers_get_no_address_space_cap_and_cpu_workers_the_one_asked_for():
    from zoo.contract import OptionError
    from zoo.runner import default_memory_limit, worker_memory_limit

    assert worker_memory_limit("cuda", None) is None  # CUDA reserves more address space than any useful cap
    assert worker_memory_limit("cpu", 2) == 2 * 2 ** 30
    assert worker_memory_limit("cpu", None) == default_memory_limit()
    with pytest.raises(OptionError, match="--memory-limit"):
        worker_memory_limit("cuda", 4)


def test_each_job_records_the_machine_it_ran_on(finished_run):
    import socket

    from zoo.store import Store

    _, out = finished_run
    store = Store(out / "results.sqlite")
    jobs = store.jobs(store.latest_run())
    done = jobs[jobs.status == "done"]
    assert not done.empty
    assert all(p["ran_on"]["host"] == socket.gethostname() and p["ran_on"]["device"] == "cpu" for p in done.provenance)
    assert store.device_kinds(store.latest_run()) == [f"cpu: {done.provenance.iloc[0]['ran_on']['cpu']}"]
    assert "| ran on " in (out / "README.md").read_text()


def test_the_worker_builds_each_variant_with_the_runs_options(write_plugin):
    """--option KEY=VALUE reaches the variant a worker measures, not only the runner's checks of it."""
    import io
    import json

    from zoo.profiles import get_profile
    from zoo.worker import run_jobs

    plugins = write_plugin("reporter", '''
import zoo

@zoo.hookimpl
def zoo_register_checks(register):
    register(zoo.Check("options", "report", "what the variant was built with",
                       lambda variant, profile: iter([zoo.Result("options", "measured", detail=repr(dict(variant.options)))])))
''')
    profile = get_profile("smoke").with_overrides(variant_options={"window": 7})
    out = io.StringIO()
    run_jobs({"jobs": [{"variant": "windowed", "suite": "report"}], "profile": profile.as_dict(),
              "plugins_dirs": [str(plugins)]}, out)
    [check] = [json.loads(line) for line in out.getvalue().splitlines() if '"type": "check"' in line]
    assert "'window': 7" in check["rows"][0]["detail"]


def test_plan_puts_every_first_process_before_any_repeat_and_repeats_only_suites_measured_in_several():
    from zoo.runner import Job, plan_jobs

    jobs = plan_jobs(["a", "b"], ["correctness", "speed"], {"speed": 3})
    assert jobs == [Job("a", "correctness"), Job("a", "speed"), Job("b", "correctness"), Job("b", "speed"),
                    Job("a", "speed", 1), Job("b", "speed", 1), Job("a", "speed", 2), Job("b", "speed", 2)]
    assert plan_jobs(["a"], ["speed"]) == [Job("a", "speed")]
    assert plan_jobs(["a"], ["correctness", "speed"], {"speed": 2}, ["correctness"]) == [
        Job("a", "correctness", 0, True), Job("a", "speed"), Job("a", "speed", 1)]


BESIDE_CHECKS = '''
import time
from pathlib import Path

import torch
import zoo

MEETING = Path({meeting!r})


def meet(variant, profile):
    """Leaves a mark, then waits for the other variant's: only a run that runs both jobs at once sees two."""
    (MEETING / variant.name).touch()
    deadline = time.monotonic() + 120
    while len(list(MEETING.iterdir())) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    yield zoo.Result("met", "measured", value=float(len(list(MEETING.iterdir()))),
                     detail=f"{{torch.get_num_threads()}} thread(s)")


@zoo.hookimpl
def zoo_register_suites(register):
    register(zoo.Suite("beside", "waits for the other variant's job", side_by_side=True))


@zoo.hookimpl
def zoo_register_checks(register):
    register(zoo.Check("meet", "beside", "meets the other variant's job", meet))
'''


def _run_with_plugin(tmp_path, name: str, source: str, *arguments):
    """``zoo run ARGUMENTS`` on the smoke profile with a plugin file ``name`` holding ``source``; the run's output,
    its store and its rows, once it succeeded."""
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / name).write_text(source)
    out = run_zoo("run", *arguments, "--profile", "smoke", "--plugins-dir", plugins, "--out", tmp_path / "out",
                  timeout=300)
    assert out.returncode == 0, out.stderr
    store = Store(tmp_path / "out" / "results.sqlite")
    return out, store, store.results(store.latest_run())


def test_side_by_side_jobs_run_two_at_a_time_on_half_the_threads(tmp_path):
    """A suite that declares side_by_side has its jobs run in two workers at once (each job here waits for the
    other, so one at a time would see one mark each), each worker with half the run's threads."""
    meeting = tmp_path / "meeting"
    meeting.mkdir()
    _, _, rows = _run_with_plugin(tmp_path, "beside_checks.py", BESIDE_CHECKS.format(meeting=str(meeting)),
                                  "dot-product", "linear", "--suite", "beside", "--threads", 2)
    met = rows[rows.check == "met"]
    assert list(met.value) == [2.0, 2.0], met
    assert set(met.detail) == {"1 thread(s)"}


PROCESS_CHECKS = '''
import os

import zoo


def pid(variant, profile):
    yield zoo.Result("pid", "measured", value=float(os.getpid()))


def distinct(variant, profile, rows_by_process):
    pids = [rows[0].value for rows in rows_by_process]
    yield zoo.Result("pids", "measured", value=float(len(set(pids))), samples=pids)


def broken(variant, profile, rows_by_process):
    raise ValueError("cannot combine")


def once(variant, profile):
    yield zoo.Result("once", "measured", value=float(os.getpid()))


@zoo.hookimpl
def zoo_register_checks(register):
    register(zoo.Check("pids", "processes", "its pid in each process", pid, combine=distinct))
    register(zoo.Check("broken", "processes", "a combine that raises", pid, combine=broken))
    register(zoo.Check("once", "processes", "runs in the first process only", once))
'''


def test_a_check_with_a_combine_runs_in_each_process_and_a_combine_that_raises_costs_only_its_check(tmp_path):
    """A third party's check that gives a combine is repeated in fresh processes and combined once; one without
    runs in the first process only; a combine that raises leaves the first process's rows and an error row."""
    _, store, rows = _run_with_plugin(tmp_path, "process_checks.py", PROCESS_CHECKS, "dot-product", "--suite",
                                      "processes", "--processes", 3)
    [pids] = rows[rows.check == "pids"].itertuples()
    assert pids.value == 3.0 and len(pids.samples) == 3
    assert len(rows[rows.check == "once"]) == 1 and len(rows[rows.check == "pid"]) == 1  # broken's first process
    [error] = rows[(rows.check == "broken") & (rows.status == "error")].itertuples()
    assert "combining the rows of 3 processes failed: ValueError: cannot combine" in error.detail
    assert len(store.jobs(store.latest_run())) == 1


def test_a_run_stopped_between_passes_keeps_every_first_process(registry):
    from zoo.checks import Result
    from zoo.profiles import get_profile
    from zoo.runner import Job, execute

    store = Store.in_memory("a run stopped between passes")
    run = store.start_run(get_profile("quick").as_dict(), {}, "2026-01-01 00:00:00")
    rows = [Result("time", "measured", "full fwd n=64", 1e-3, "s", n=64, mode="full", phase="fwd",
                   samples=[1e-3, 1e-3]).as_dict()]

    class StoppedAfterTheFirstPass:
        def run(self, jobs, on_check, on_job):
            on_job({"variant": "dot-product", "suite": "speed", "process": 0, "status": "done",
                    "checks": [("speed", rows)]})
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        execute(registry, store, run, [Job("dot-product", "speed"), Job("dot-product", "speed", 1)],
                StoppedAfterTheFirstPass(), get_profile("quick"))
    assert ("dot-product", "speed") in store.finished_jobs(run)
    assert list(store.results(run).check) == ["time"]


def test_a_job_whose_first_process_crashed_is_not_repeated(tmp_path):
    out, _, rows = _run_with_plugin(tmp_path, "crashes.py", CRASHES, "crashes", "--suite", "speed", "--processes", 3)
    assert list(rows[rows.status == "error"].check) == ["worker"], rows  # one crash: the first process's
    assert "#2" in out.stderr and "#3" in out.stderr  # each further process accounted for, none run


PARENT_CHECKS = '''
import os

import zoo


def parent(variant, profile):
    yield zoo.Result("parent", "measured", value=float(os.getppid()),
                     detail="leads its session" if os.getsid(0) == os.getpid() else "in its parent's session")


def parents(variant, profile, rows_by_process):
    rows = [rows[0] for rows in rows_by_process]
    yield zoo.Result("parents", "measured", value=float(len({row.value for row in rows})),
                     samples=[row.value for row in rows], detail=", ".join(sorted({row.detail for row in rows})))


@zoo.hookimpl
def zoo_register_checks(register):
    register(zoo.Check("parent", "parents", "the worker's parent process, in each process", parent, combine=parents))
'''


def test_every_worker_of_a_run_is_forked_by_one_launcher_into_a_session_of_its_own(tmp_path):
    """Workers start from the run's launcher (torch imported once), each still a process and session of its own."""
    _, _, rows = _run_with_plugin(tmp_path, "parent_checks.py", PARENT_CHECKS, "dot-product", "linear", "--suite",
                                  "parents", "--processes", 2)
    combined = rows[rows.check == "parents"]
    assert list(combined.value) == [1.0, 1.0], combined  # both processes of a variant: the same parent
    assert set(combined.detail) == {"leads its session"}
    assert len({pid for samples in combined.samples for pid in samples}) == 1  # and the same for both variants


def test_a_quiet_run_says_it_is_still_running_once_per_quiet_stretch():
    """The heartbeat's rule, on a clock the test moves: nothing while lines keep coming, then one line per
    ``every`` seconds of quiet, saying how long it has been quiet."""
    from zoo.runner import Heartbeat

    last = [0.0]
    beat = Heartbeat(lambda quiet: f"quiet {quiet:.0f} s", lambda: last[0], every=60.0)
    assert [beat.due(t) for t in (10.0, 59.0)] == [None, None]
    assert beat.due(61.0) == "quiet 61 s" and beat.due(100.0) is None and beat.due(121.0) == "quiet 121 s"
    last[0] = 130.0  # a check finished
    assert beat.due(150.0) is None and beat.due(190.0) == "quiet 60 s"


def test_a_run_that_prints_nothing_for_a_while_says_it_is_still_running(registry, tmp_path, monkeypatch):
    """Wired into a run: an executor that finishes nothing gets a 'still running' line (the test waits for it,
    with no bound but a generous one)."""
    import threading

    from zoo import runner

    monkeypatch.setattr(runner, "HEARTBEAT_SECONDS", 0.05)
    store = Store(tmp_path / "results.sqlite")
    run = store.start_run(get_profile("smoke").as_dict(), {"device": "cpu"}, "2026-01-01 00:00:00")
    said = threading.Event()
    lines = []

    class Quiet:
        def run(self, jobs, on_check, on_job):
            assert said.wait(60), lines

    def progress(line):
        lines.append(line)
        said.set()

    runner.execute(registry, store, run, [runner.Job("dot-product", "correctness", 0)], Quiet(), get_profile("smoke"),
                   progress)
    assert lines[0].startswith("\r[0/1] still running: ") and lines[0].endswith(" s since the run began\n")


def test_a_local_run_starts_its_first_launcher_before_the_plugins_load_and_every_lane_before_any_job(
        tmp_path, monkeypatch):
    """The launcher's import of torch overlaps the runner's own start; the other lanes' launchers start before the
    run is announced and its first job is handed out, never while a job is timed."""
    import zoo.harness
    import zoo.registry
    import zoo.runner

    events = []
    lane, load_registry = zoo.runner.Launchers.lane, zoo.registry.load_registry
    execute = zoo.harness._execute

    def noting_lane(self, index):
        if index not in self._started:
            events.append(f"lane {index}")
        return lane(self, index)

    monkeypatch.setattr(zoo.runner.Launchers, "lane", noting_lane)
    monkeypatch.setattr(zoo.registry, "load_registry", lambda *a, **k: events.append("plugins") or load_registry(*a, **k))
    monkeypatch.setattr(zoo.harness, "_execute", lambda *a, **k: events.append("jobs") or execute(*a, **k))
    zoo.harness.run(["dot-product", "linear"], suites=["correctness"], profile="smoke", out=tmp_path,
                    progress=lambda line: events.append("announced") if line.startswith("zoo: run ") else None)
    assert events[:events.index("jobs") + 1] == ["lane 0", "plugins", "lane 1", "announced", "jobs"]
