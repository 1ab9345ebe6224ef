"""The Ray executor runs the same jobs as the local one, into the same store, against a local Ray."""

import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from conftest import good_plugin, run_zoo
from zoo.leaderboard import render
from zoo.store import Store

pytest.importorskip("ray", reason="the Ray executor is an optional extra: pip install 'attention-zoo[ray]'")

KILLS_RAY_WORKER = good_plugin("kills-ray-worker").replace(
    "        h = self.num_heads\n        return",
    "        import os, signal\n        os.kill(os.getppid(), signal.SIGKILL)\n        h = self.num_heads\n        return")


def run(out, *args):
    return run_zoo("run", *args, "--profile", "smoke", "--out", out)


def test_ray_gives_the_same_verdicts_and_exponents_as_local_in_the_same_store(tmp_path, short_out):
    out = short_out
    for executor in ("local", "ray"):
        done = run(out, "linear", "--suite", "correctness", "--suite", "complexity", "--executor", executor)
        assert done.returncode == 0, done.stderr
    store = Store(out / "results.sqlite")
    local, ray = (store.results(r) for r in store.runs().run_id)
    key = ["variant", "suite", "check", "setting"]
    verdicts = [f[f.suite == "correctness"].set_index(key).status.sort_index() for f in (local, ray)]
    pd.testing.assert_series_equal(*verdicts)
    exponents = [f[f.check.isin(["flops-exponent", "memory-exponent"])].set_index(key).value.sort_index() for f in (local, ray)]
    pd.testing.assert_series_equal(*exponents)
    assert exponents[0].notna().all(), exponents[0]  # every mode climbed far enough to fit an exponent
    boards = []
    for run_id in store.runs().run_id:  # the same leaderboard, run header aside
        render(store, run_id, tmp_path / run_id)
        boards.append((tmp_path / run_id / "README.md").read_text().split("## Leaderboard", 1)[1])
    assert boards[0] == boards[1]
    assert any((out / ".zoo-cache" / "ray").iterdir())  # Ray's temporary files stayed in the output folder


@pytest.fixture
def short_out():
    """An output folder whose path is short enough for Ray's unix sockets (about 107 characters)."""
    import shutil
    import tempfile

    out = Path(tempfile.mkdtemp(prefix="zr", dir="/tmp"))
    yield out
    shutil.rmtree(out, ignore_errors=True)


def test_a_killed_ray_worker_gives_an_error_row_and_the_run_goes_on(tmp_path):
    (tmp_path / "kills.py").write_text(KILLS_RAY_WORKER)
    done = run(tmp_path / "out", "dot-product", "kills-ray-worker", "--suite", "correctness", "--executor", "ray",
               "--plugins-dir", tmp_path)
    assert done.returncode == 0, done.stderr
    results = pd.read_csv(tmp_path / "out" / "results.csv")
    errors = results[(results.variant == "kills-ray-worker") & (results.status == "error")]
    assert errors.detail.str.contains("the Ray task failed", regex=False).any(), errors.detail.tolist()
    good = results[results.variant == "dot-product"]
    assert not good.empty and set(good.status) <= {"passed", "skipped"}


def test_missing_ray_says_how_to_install(tmp_path):
    code = ("import sys; sys.modules['ray'] = None; import zoo.cli; "
            f"sys.exit(zoo.cli.main(['run-all', '--executor', 'ray', '--out', {str(tmp_path)!r}]))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "pip install 'attention-zoo[ray]'" in done.stderr


class FakeRay:
    """Just enough of ray for the resource check: the nodes a cluster reports."""

    def __init__(self, *nodes):
        self._nodes = [{"Alive": True, "Resources": resources} for resources in nodes]

    def nodes(self):
        return self._nodes


@pytest.mark.parametrize("device, threads, nodes, refused", [
    ("cpu", 2, [{"CPU": 2.0}], None),
    ("cpu", 4, [{"CPU": 2.0}, {"CPU": 2.0}], "4 CPUs (--threads)"),  # no single node has four
    ("cuda", 2, [{"CPU": 16.0, "GPU": 1.0}], None),
    ("cuda", 2, [{"CPU": 16.0}], "2 CPUs (--threads) and one GPU (--device cuda)"),
    ("cuda", 4, [{"CPU": 2.0, "GPU": 1.0}, {"CPU": 16.0}], "4 CPUs (--threads) and one GPU"),  # not on one node
])
def test_a_job_no_node_can_hold_is_refused_instead_of_waiting_for_ever(device, threads, nodes, refused):
    from zoo.contract import OptionError
    from zoo.profiles import PROFILES
    from zoo.ray_executor import RayExecutor
    from zoo.runner import RunOptions

    executor = RayExecutor(RunOptions(PROFILES["smoke"].with_overrides(device=device, threads=threads), 60))
    executor.ray = FakeRay(*nodes)
    if refused is None:
        executor.check_cluster()
        return
    with pytest.raises(OptionError, match="no node of the local Ray cluster") as error:
        executor.check_cluster()
    assert refused in str(error.value)


def test_an_address_where_nothing_listens_fails_at_once_without_starting_a_run(tmp_path):
    with socket.socket() as probe:  # a port nothing listens on: bound, never listening
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
        done = run(tmp_path, "dot-product", "--executor", "ray", "--address", f"127.0.0.1:{port}")
    assert done.returncode == 2 and f"--address 127.0.0.1:{port}: nothing answers there" in done.stderr
    assert not (tmp_path / "results.sqlite").exists()
