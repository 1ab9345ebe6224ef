"""Faults a user, a plugin or the machine can cause: each gets one line naming the cause, exit 2 for
the user's own bad input, an error row for a plugin's fault, and nothing is lost or written where it
should only be read."""

import hashlib
import io
import os
import pickle
import sqlite3
import tempfile

import pytest
import torch

import zoo
from conftest import good_plugin, run_zoo, zoo_here
from zoo.contract import VariantInputError
from zoo.runner import SCRATCH_PREFIX, remove_stale_scratch
from zoo.store import Store


def _one_error_line(done, *needles):
    status, lines = done
    assert status == 2, lines
    assert len(lines) == 1 and lines[0].startswith("zoo"), lines
    assert all(needle in lines[0] for needle in needles), lines[0]


def _digest(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.mark.parametrize("args, needles", [
    (["--memory-limit", "nan"], ["--memory-limit", "finite"]),
    (["--memory-limit", "inf"], ["--memory-limit", "finite"]),
    (["--timeout", "nan"], ["--timeout", "finite"]),
    (["--lengths", "1000000000"], ["--lengths", "1000000000"]),
    (["--threads", "100000"], ["--threads", "100000"]),
    (["--profile", "quick", "--bogus"], ["unrecognized arguments", "--bogus"]),
    (["--executor", "nope"], ["--executor", "nope"]),
])
def test_bad_values_get_one_line_and_exit_2(tmp_path, capsys, args, needles):
    _one_error_line(zoo_here(capsys, "run", "dot-product", "--out", tmp_path, *args), *needles)
    assert not (tmp_path / "results.sqlite").exists() or Store(tmp_path / "results.sqlite").runs().empty


def test_a_plugin_that_exits_at_import_is_a_warning_and_the_run_goes_on(write_plugin, tmp_path):
    write_plugin("quitter", "raise SystemExit(0)\n")
    plugins = write_plugin("fine", good_plugin("fine"))
    done = run_zoo("run", "fine", "--suite", "correctness", "--profile", "smoke", "--plugins-dir", plugins,
                   "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    assert "plugin 'quitter'" in done.stderr and "SystemExit" in done.stderr
    assert (tmp_path / "README.md").exists()


@pytest.mark.parametrize("content", [os.urandom(4096), b"SQLite format 3\x00" + b"\x00" * 50])
def test_a_file_that_is_not_a_results_database_is_one_line_and_never_changed(tmp_path, capsys, content):
    database = tmp_path / "results.sqlite"
    database.write_bytes(content)
    before = _digest(database)
    for args in (["leaderboard", "--out", tmp_path], ["run", "dot-product", "--suite", "correctness", "--out", tmp_path],
                 ["run", "dot-product", "--resume", "--out", tmp_path], ["compare", "a", "b", "--out", tmp_path]):
        _one_error_line(zoo_here(capsys, *args), "results database")
    other = tmp_path / "elsewhere"
    other.mkdir()
    _one_error_line(zoo_here(capsys, "merge", database, "--out", other), "results database")
    assert _digest(database) == before


def _finished_store(tmp_path):
    done = run_zoo("run", "dot-product", "--suite", "correctness", "--profile", "smoke", "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    return tmp_path / "results.sqlite"


def test_a_store_from_a_newer_zoo_is_refused_untouched_and_gets_no_phantom_run(tmp_path, capsys):
    database = _finished_store(tmp_path)
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA user_version = 99")
        db.execute("PRAGMA journal_mode = DELETE")
    before = _digest(database)
    for args in (["leaderboard"], ["run", "dot-product", "--suite", "correctness"], ["run", "dot-product", "--resume"]):
        _one_error_line(zoo_here(capsys, *args, "--out", tmp_path), "newer zoo")
    assert _digest(database) == before


def test_reading_commands_leave_the_store_and_a_merge_source_as_they_were(tmp_path):
    database = _finished_store(tmp_path / "a")
    with sqlite3.connect(database) as db:
        db.execute("PRAGMA journal_mode = DELETE")  # a store another tool or an older zoo left behind
    before = _digest(database)
    assert run_zoo("leaderboard", "--out", tmp_path / "a").returncode == 0
    assert run_zoo("merge", database, "--out", tmp_path / "b").returncode == 0
    assert _digest(database) == before
    assert not database.with_name("results.sqlite-wal").exists()
    assert len(Store(tmp_path / "b" / "results.sqlite").runs()) == 1


def test_a_plugin_constructor_bug_is_that_variants_error_rows_not_the_users_exit_2(write_plugin, tmp_path):
    source = good_plugin("bugged", init="len(5)")
    plugins = write_plugin("bugged", source)
    done = run_zoo("run", "bugged", "--suite", "correctness", "--profile", "smoke", "--d-model", "64", "--heads", "2",
                   "--plugins-dir", plugins, "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "results.sqlite")
    results = store.results(store.latest_run())
    assert (results.status == "error").any() and results[results.status == "error"].detail.str.contains("len").any()


def test_a_check_whose_applies_raises_is_an_error_row_and_the_next_check_runs(write_plugin, tmp_path):
    plugins = write_plugin("trouble", '''
import zoo
from zoo.checks import Check, Result

def bad_applies(tags):
    raise RuntimeError("applies exploded")

@zoo.hookimpl
def zoo_register_checks(register):
    register(Check("fragile", "trouble", "raises in applies", lambda v, p: iter(()), bad_applies))
    register(Check("sturdy", "trouble", "always measures", lambda v, p: iter([Result("sturdy", "measured", value=1.0)])))
''')
    done = run_zoo("run", "dot-product", "--suite", "trouble", "--profile", "smoke", "--plugins-dir", plugins,
                   "--out", tmp_path)
    assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "results.sqlite")
    results = store.results(store.latest_run()).set_index("check")
    assert results.loc["fragile", "status"] == "error" and "applies exploded" in results.loc["fragile", "detail"]
    assert results.loc["sturdy", "status"] == "measured"


def test_a_killed_worker_can_be_retried_with_resume_retry_errors(write_plugin, tmp_path):
    marker = tmp_path / "killed-once"
    source = good_plugin("fragile", before=f"""
        import os, signal
        if not os.path.exists({str(marker)!r}):
            open({str(marker)!r}, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)""")
    plugins = write_plugin("fragile", source)
    args = ("run", "fragile", "--suite", "correctness", "--profile", "smoke", "--plugins-dir", plugins, "--out", tmp_path)
    assert run_zoo(*args).returncode == 0
    store = Store(tmp_path / "results.sqlite")
    run_id = store.latest_run()
    assert list(store.jobs(run_id).status) == ["error"]
    again = run_zoo(*[a for a in args if a not in ("--profile", "smoke")], "--resume", "--retry-errors")  # its own
    assert again.returncode == 0, again.stderr
    assert store.latest_run() == run_id and list(store.jobs(run_id).status) == ["done"]
    assert not (store.results(run_id).status == "error").any()


def test_worker_folders_of_a_runner_that_died_are_removed_by_the_next_run():
    stale = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{2 ** 22 + 12345}-")  # no such process
    mine = tempfile.mkdtemp(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-")
    try:
        removed = [str(p) for p in remove_stale_scratch()]
        assert stale in removed and not os.path.exists(stale) and os.path.exists(mine)
    finally:
        os.rmdir(mine)


def test_builtins_accept_a_one_dimensional_key_mask_as_torch_sdpa_does(registry):
    torch.manual_seed(0)
    x = torch.randn(2, 6, 16)
    keep = torch.tensor([True, False, True, True, False, True])
    for name in registry.list_variants():
        module = zoo.create(name, d_model=16, num_heads=2, registry=registry)
        if not registry.variant(name).tags.accepts_attn_mask:
            continue
        causal = registry.variant(name).tags.causal_only  # the one mode it computes
        expected = module(x, x, x, attn_mask=keep.view(1, 6), is_causal=causal)
        assert torch.allclose(module(x, x, x, attn_mask=keep, is_causal=causal), expected, atol=1e-6), name


def test_builtins_return_an_empty_output_for_an_empty_batch(registry):
    x = torch.randn(0, 5, 16)
    for name in registry.list_variants():
        module = zoo.create(name, d_model=16, num_heads=2, registry=registry)
        for causal in (mode == "causal" for mode in registry.variant(name).tags.modes):
            assert module(x, x, x, is_causal=causal).shape == (0, 5, 16), (name, causal)


def test_a_model_of_zoo_layers_round_trips_through_pickle_and_torch_save(registry):
    torch.manual_seed(0)
    for name in registry.list_variants():
        model = torch.nn.ModuleList([zoo.create(name, d_model=16, num_heads=2, registry=registry) for _ in range(2)])
        buffer = io.BytesIO()
        torch.save(model, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=False)
        copy = pickle.loads(pickle.dumps(model))
        x, causal = torch.randn(1, 4, 16), registry.variant(name).tags.causal_only
        for other in (loaded, copy):
            assert torch.equal(other[1](other[0](x, x, x, is_causal=causal), x, x, is_causal=causal),
                               model[1](model[0](x, x, x, is_causal=causal), x, x, is_causal=causal)), name
            with pytest.raises(VariantInputError, match=name):  # the input checks came along
                other[0](x[0], x, x)


def test_zoo_modules_keep_working_under_torch_compile_and_torch_export(registry):
    """Graph capture sees through the zoo's input checks (aot_eager: the capture, without a C++ compiler)."""
    torch.manual_seed(0)
    x = torch.randn(2, 8, 16)
    for name in registry.list_variants():
        module = zoo.create(name, d_model=16, num_heads=2, registry=registry)
        causal = {"is_causal": registry.variant(name).tags.causal_only}  # the one mode a causal-only variant computes
        expected = module(x, x, x, **causal)
        compiled = torch.compile(module, backend="aot_eager")
        assert torch.allclose(compiled(x, x, x, **causal), expected, atol=1e-6), name
        exported = torch.export.export(module, (x, x, x), causal).module()
        assert torch.allclose(exported(x, x, x, **causal), expected, atol=1e-6), name


def test_a_ray_address_that_cannot_be_reached_leaves_no_run_behind(tmp_path):
    pytest.importorskip("ray", reason="the Ray executor is an optional extra")
    done = run_zoo("run", "dot-product", "--executor", "ray", "--address", "notanaddress", "--suite", "correctness",
                   "--profile", "smoke", "--out", tmp_path)
    assert done.returncode == 2 and "--address notanaddress" in done.stderr.splitlines()[-1]
    assert Store(tmp_path / "results.sqlite").runs().empty


def test_ctrl_c_while_the_first_worker_starts_stops_the_run_with_status_130(tmp_path):
    """SIGINT to the whole process group, as a terminal sends it, right after the run is announced."""
    import signal
    import subprocess
    import sys

    # SIGINT at its default in the child, as in a terminal's foreground job: when the tests themselves run as a
    # background job of a script, children inherit SIGINT ignored, and the run rightly ignores it
    process = subprocess.Popen([sys.executable, "-m", "zoo", "run", "dot-product", "linear", "--suite", "correctness",
                                "--profile", "smoke", "--out", str(tmp_path)], stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    announced = process.stderr.readline()
    assert announced.startswith("zoo: run "), announced
    os.killpg(process.pid, signal.SIGINT)
    rest = process.communicate(timeout=120)[1]
    assert process.returncode == 130, rest
    assert "interrupted" in rest
    runs = Store(tmp_path / "results.sqlite").runs()
    assert runs.empty or runs.finished.isna().all()  # nothing claims to be a finished run


def test_an_ignored_ctrl_c_stays_ignored_while_workers_run():
    """A background job of a script starts with SIGINT ignored; the runner's Ctrl-C handler leaves it so."""
    import signal

    from zoo.runner import CtrlC

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with CtrlC():
            assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        signal.signal(signal.SIGINT, signal.default_int_handler)
        with CtrlC() as ctrl_c:
            assert signal.getsignal(signal.SIGINT) == ctrl_c._on_signal
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_a_plugin_that_loads_in_the_runner_but_not_in_its_worker_says_why(write_plugin, tmp_path):
    source = "import os\nif os.environ.get('MALLOC_MMAP_MAX_') == '0':  # set for workers only\n" \
             "    raise ImportError('this plugin refuses to load in workers')\n" + good_plugin("shy")
    plugins = write_plugin("shy", source)
    done = run_zoo("run", "shy", "--suite", "correctness", "--profile", "smoke", "--plugins-dir", plugins,
                   "--out", tmp_path, env={"MALLOC_MMAP_MAX_": ""})
    assert done.returncode == 0, done.stderr
    store = Store(tmp_path / "results.sqlite")
    detail = " ".join(store.results(store.latest_run()).detail)
    assert "did not load in the worker" in detail and "refuses to load in workers" in detail
