"""The Ray executor runs the same jobs as the local one, into the same store, against a local Ray."""

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pandas as pd
import pytest

from conftest import KILL_THE_RUNNER, good_plugin, run_python, run_zoo
from zoo.leaderboard import render
from zoo.store import Store

pytest.importorskip("ray", reason="the Ray executor is an optional extra: pip install 'attention-zoo[ray]'")

KILLS_RAY_WORKER = good_plugin("kills-ray-worker", before=KILL_THE_RUNNER)


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
    done = run_python("-c", code, timeout=120)
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
    from zoo.profiles import get_profile
    from zoo.ray_executor import RayExecutor
    from zoo.runner import RunOptions

    executor = RayExecutor(RunOptions(get_profile("smoke").with_overrides(device=device, threads=threads), 60))
    executor.ray = FakeRay(*nodes)
    if refused is None:
        executor.check_cluster()
        return
    with pytest.raises(OptionError, match="no node of the local Ray cluster") as error:
        executor.check_cluster()
    assert refused in str(error.value)


LOOPBACK = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0"}
"""Ray on loopback only, so these tests send nothing to the machine's network address: Ray otherwise
connects to that address for 127.0.0.1, and a cluster it starts listens there too."""
TOKEN = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": "zoo-test-token-0123456789abcdef"}
"""Token authentication with a fixed token, in the environment, so this machine's own ~/.ray/auth_token
plays no part."""


def environment_without_ray_tokens() -> dict[str, str]:
    return {name: value for name, value in os.environ.items() if not name.startswith("RAY_AUTH_")}


@pytest.fixture
def silent_server():
    """A TCP server that takes connections and never says a word, like a bare socat listener: the kernel
    completes each handshake on the listening socket."""
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen(128)
        yield f"127.0.0.1:{server.getsockname()[1]}"


@pytest.fixture
def http_server(tmp_path):
    """What `python -m http.server` runs: something that answers, in HTTP/1.1."""
    class Quiet(SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), lambda *a: Quiet(*a, directory=str(tmp_path)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def closed_port():
    """A port nothing listens on: bound, never listening, so no one else takes it meanwhile."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        yield f"127.0.0.1:{probe.getsockname()[1]}"


NOT_A_CLUSTER = "something answers there, but not a Ray cluster: no Ray GCS replied within"


@pytest.mark.parametrize("server, found", [("silent_server", NOT_A_CLUSTER), ("http_server", NOT_A_CLUSTER),
                                           ("closed_port", "nothing answers there")], ids=["silent", "http", "closed"])
def test_an_address_without_a_ray_cluster_fails_in_one_line_before_a_run_starts(tmp_path, request, server, found):
    address = request.getfixturevalue(server)
    temp = tmp_path / "tmp"  # where Ray would put any log file of its own
    temp.mkdir()
    started = time.monotonic()
    done = run_zoo("run-all", "--executor", "ray", "--address", address, "--profile", "smoke", "--out", tmp_path / "out",
                   env={**LOOPBACK, "TMPDIR": str(temp)}, timeout=120)
    took = time.monotonic() - started
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()  # Ray's own log lines stay out of the terminal
    assert line.startswith(f"zoo: error: --address {address}: {found}"), line
    assert "`ray start --head` prints it" in line  # how to find the right address
    assert done.stdout == ""
    assert took < 45, took  # Ray itself tried for minutes; most of this is the zoo starting on a busy machine
    assert not (tmp_path / "out" / "results.sqlite").exists() or Store(tmp_path / "out" / "results.sqlite").runs().empty
    assert not any(temp.iterdir()), list(temp.iterdir())


@pytest.fixture(scope="module")
def ray_cluster():
    """A one-CPU Ray cluster on loopback with token authentication (what ray.init and `ray start --head`
    set up by default): its GCS address. Its driver shuts it down when its standard input closes."""
    temp_dir = Path(tempfile.mkdtemp(prefix="zr", dir="/tmp"))  # short, for Ray's unix sockets
    code = ("import sys, ray\n"
            "ray.init(num_cpus=1, include_dashboard=False, _temp_dir=sys.argv[1])\n"
            "print(ray.get_runtime_context().gcs_address, flush=True)\n"
            "sys.stdin.read()\n"
            "ray.shutdown()\n")
    driver = subprocess.Popen([sys.executable, "-c", code, str(temp_dir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, env={**os.environ, **LOOPBACK, **TOKEN})
    try:
        address = driver.stdout.readline().strip()
        assert address.startswith("127.0.0.1:"), address
        yield address
    finally:
        driver.stdin.close()
        try:
            driver.wait(timeout=60)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()
        shutil.rmtree(temp_dir, ignore_errors=True)


def test_a_ray_cluster_address_is_accepted_and_ray_stays_quiet(ray_cluster, tmp_path):
    done = run_zoo("run", "dot-product", "--suite", "correctness", "--executor", "ray", "--address", ray_cluster,
                   "--profile", "smoke", "--out", tmp_path, env={**LOOPBACK, **TOKEN})
    assert done.returncode == 0, done.stderr
    lines = done.stderr.splitlines()
    assert lines and all(line.startswith(("zoo: ", "[1/1] dot-product")) for line in lines), lines
    results = pd.read_csv(tmp_path / "results.csv")
    assert not results.empty and set(results.status) <= {"passed", "skipped"}


def test_what_ray_prints_while_connecting_goes_to_a_log_and_not_to_the_terminal(tmp_path):
    """Ray's C++ client writes to file descriptor 2 itself, past sys.stderr."""
    code = ("import os, sys\n"
            "from pathlib import Path\n"
            "from zoo.ray_executor import stderr_into\n"
            "with stderr_into(Path(sys.argv[1])):\n"
            "    os.write(2, b'[W] rpc_client.h: Failed to connect to GCS\\n')\n"
            "    print('ray logger: a warning', file=sys.stderr)\n"
            "print('zoo: error: after', file=sys.stderr)\n")
    log = tmp_path / "ray-connect.log"
    done = run_python("-c", code, log, timeout=60)
    assert done.returncode == 0 and done.stderr == "zoo: error: after\n", done.stderr
    assert log.read_text() == "[W] rpc_client.h: Failed to connect to GCS\nray logger: a warning\n"


def test_a_ray_cluster_that_refuses_this_machines_token_fails_in_one_line(ray_cluster, tmp_path):
    done = run_zoo("run", "dot-product", "--executor", "ray", "--address", ray_cluster, "--profile", "smoke",
                   "--out", tmp_path, env={**environment_without_ray_tokens(), **LOOPBACK}, inherit=False, timeout=120)
    assert done.returncode == 2, done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith(f"zoo: error: --address {ray_cluster}: Ray's token authentication failed"), line
    assert "RAY_AUTH_MODE=token" in line
    assert not (tmp_path / "results.sqlite").exists()
