"""Where workers keep torch's caches: the zoo's cache folder, unless the user chose."""

import os

import pandas as pd

from conftest import run_zoo

from zoo.environment import CACHE_FOLDERS, cache_env

ENV_PROBE = '''
import os
import zoo
from zoo.checks import Result


def probe(variant, profile):
    for name in sorted(zoo.environment.CACHE_FOLDERS):
        yield Result("cache-folder", "measured", name, detail=os.environ.get(name, "unset"))


@zoo.hookimpl
def zoo_register_checks(register):
    register(zoo.Check("env-probe", "env-probe", "where a worker keeps torch's caches", probe))
'''


def test_torch_caches_go_to_the_zoo_cache_folder_unless_the_user_chose(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    for name in CACHE_FOLDERS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TORCH_HOME", "/my/own/torch")
    env = cache_env()
    assert "TORCH_HOME" not in env
    assert env["TRITON_CACHE_DIR"] == str(tmp_path / "zoo" / "triton")
    assert all(path.startswith(str(tmp_path / "zoo")) for path in env.values())


def test_a_worker_runs_with_those_folders(tmp_path):
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "env_probe.py").write_text(ENV_PROBE)
    env = {k: v for k, v in os.environ.items() if k not in CACHE_FOLDERS}
    done = run_zoo("run", "dot-product", "--suite", "env-probe", "--profile", "smoke", "--plugins-dir", plugins,
                   "--out", tmp_path / "out", timeout=300, env={**env, "XDG_CACHE_HOME": str(tmp_path / "cache")},
                   inherit=False)
    assert done.returncode == 0, done.stderr
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    folders = results[results.check == "cache-folder"].set_index("setting").detail
    assert set(folders.index) == set(CACHE_FOLDERS)
    assert all(path.startswith(str(tmp_path / "cache" / "zoo")) for path in folders), folders.to_dict()


def test_a_run_shared_value_is_made_by_its_first_process_and_read_back_alike_by_every_later_one(tmp_path,
                                                                                                 monkeypatch):
    from zoo.environment import RUN_CACHE, run_shared

    made = []
    make = lambda value: lambda: made.append(value) or [value, 2048]
    monkeypatch.delenv(RUN_CACHE, raising=False)
    assert run_shared("peak", make(1.5), tuple) == (1.5, 2048) and run_shared("peak", make(2.5), tuple) == (2.5, 2048)
    assert made == [1.5, 2.5]  # no shared folder (one process, the Python API): every call measures
    monkeypatch.setenv(RUN_CACHE, str(tmp_path))
    made.clear()
    first = run_shared("peak", make(3.5), tuple)
    later = run_shared("peak", make(4.5), tuple)
    other = run_shared("bandwidth", make(5.5), tuple)
    assert first == later == (3.5, 2048) and other == (5.5, 2048) and made == [3.5, 5.5]
    assert sorted(path.suffix for path in tmp_path.iterdir()) == [".json", ".json"]  # no staging file left


def test_a_value_made_once_in_a_run_is_read_back_by_later_processes_within_the_runs_budget(tmp_path, monkeypatch):
    import torch

    from zoo.environment import RUN_CACHE, made_once_in_run

    made = []

    def make(value):
        return lambda: made.append(value) or {"cache": torch.full((4, 8), float(value)), "length": value}

    monkeypatch.delenv(RUN_CACHE, raising=False)
    state, here = made_once_in_run("state", make(1), 2 ** 20)
    assert here and state["length"] == 1 and made == [1]  # no shared folder: every call makes its own
    monkeypatch.setenv(RUN_CACHE, str(tmp_path))
    first, here_first = made_once_in_run("state", make(2), 2 ** 20)
    later, here_later = made_once_in_run("state", make(3), 2 ** 20)
    assert here_first and not here_later and made == [1, 2]
    assert torch.equal(later["cache"], first["cache"]) and later["length"] == 2
    assert later["cache"].data_ptr() != first["cache"].data_ptr()  # a copy of its own, to advance on its own
    made_once_in_run("too big", make(4), 100)  # over what the run keeps: made again by each process
    _, here_again = made_once_in_run("too big", make(5), 100)
    made_once_in_run("unsaved", lambda: made.append(6) or (lambda: 0), 2 ** 20)  # cannot be saved
    _, here_unsaved = made_once_in_run("unsaved", lambda: made.append(7) or (lambda: 0), 2 ** 20)
    assert here_again and here_unsaved and made == [1, 2, 4, 5, 6, 7]
    assert sorted(path.name.startswith("made-") for path in tmp_path.iterdir()) == [True]  # nothing staged left
