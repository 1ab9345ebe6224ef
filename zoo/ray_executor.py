"""Run the same jobs on a Ray cluster (``zoo run-all --executor ray [--address ADDR]``).

Each job (variant x suite) is one Ray task that asks for the resources it needs (the profile's CPU
threads, and a whole GPU in a cuda run) and runs the job in a fresh worker process exactly as the local
executor does; finished jobs stream back into the same store as Ray reports them. A Ray worker that
dies gives that job an ``error`` row and the run goes on. Ray is an optional extra. A host:port given
with ``--address`` is first asked, in a child process, whether a Ray cluster answers there, so a wrong
one fails in seconds and before a run starts, where Ray itself would retry for minutes.
"""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

from .contract import OptionError
from .environment import zoo_cache_dir
from .runner import Job, RunOptions, error_job, run_in_worker

INSTALL_HINT = "pip install 'attention-zoo[ray]'"
MAX_TEMP_PATH = 40
CONNECT_LOG = "ray-connect.log"  # what Ray printed while connecting to --address, in the scratch folder
GCS_ANSWER_SECONDS = 2  # a Ray GCS answers in milliseconds; an HTTP or silent server never does
PROBE_LIMIT_SECONDS = GCS_ANSWER_SECONDS + 12  # the probe's own start on a busy machine; then it is killed
FIND_THE_ADDRESS = ("the head node's `ray start --head` prints it (its GCS, port 6379 unless --port chose another), "
                    "and --address auto finds a cluster started on this machine")


def require_ray():
    """Ray, or one line saying how to install it."""
    try:
        import ray
    except ImportError:
        raise OptionError(f"--executor ray: Ray is not installed; install the extra with: {INSTALL_HINT}") from None
    return ray


def _run_job(job: Job, options: RunOptions) -> list[tuple[str, dict]]:
    """Inside a Ray task: the job in a worker process; its check and job records, in order."""
    records: list[tuple[str, dict]] = []
    run_in_worker([job], options, lambda r: records.append(("check", r)), lambda r: records.append(("job", r)))
    return records


# Run by probe_gcs in a child process: Ray's own GCS client asks for the cluster id (the first call every
# Ray client makes), after the token check ray.init makes first. The child keeps Ray's C++ logging, which
# writes to stderr, and any crash of it out of the zoo's process; it prints one verdict line.
ASK_FOR_CLUSTER_ID = """
import sys
try:
    from ray._private.authentication.authentication_token_setup import ensure_token_if_auth_enabled
    from ray._raylet import InnerGcsClient
    from ray.exceptions import AuthenticationError, RpcError
except ImportError:
    sys.exit()  # an older Ray: no verdict, ray.init judges the address
try:
    ensure_token_if_auth_enabled(None, create_token_if_missing=False)
    InnerGcsClient.standalone(sys.argv[1], None, int(sys.argv[2]))
except AuthenticationError as exc:
    print("token", str(exc).split(". ")[0])
except RpcError as exc:
    print("none", str(exc).rstrip("."))
else:
    print("gcs")
"""


def probe_gcs(address: str) -> tuple[str, str]:
    """What answers at a host:port, as Ray's GCS client sees it: ("gcs", ""), ("none", why) or ("token",
    why); ("", "") when the probe gave no verdict (an older Ray, or a crash), which leaves it to ray.init."""
    # Ray's client would first wait up to 5 s for each of its two channels; the call's own deadline is enough
    env = {**os.environ, "RAY_gcs_rpc_server_connect_timeout_s": "0"}
    try:
        done = subprocess.run([sys.executable, "-c", ASK_FOR_CLUSTER_ID, address, str(GCS_ANSWER_SECONDS * 1000)],
                              stdin=subprocess.DEVNULL, capture_output=True, text=True, env=env,
                              timeout=PROBE_LIMIT_SECONDS)
    except subprocess.TimeoutExpired:  # the child has been killed and waited for
        return "none", f"no answer within {PROBE_LIMIT_SECONDS} s"
    verdict, _, reason = (done.stdout.strip().splitlines() or [""])[-1].partition(" ")
    return (verdict, " ".join(reason.split())) if verdict in ("gcs", "none", "token") else ("", "")


def check_reachable(address: str) -> None:
    """Fail in seconds, before a run starts, unless a Ray cluster answers at a host:port address: Ray
    itself retries for minutes against anything else, printing its C++ client's log as it goes."""
    scheme, _, rest = address.rpartition("://")
    host, _, port = rest.rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and other forms: Ray judges them
    if scheme:  # ray://: a Ray Client server, which speaks another protocol than a GCS; Ray judges the rest
        target = rest
    else:  # where ray.init will connect: it swaps localhost for this machine's own address
        from ray._private.services import canonicalize_bootstrap_address

        target = canonicalize_bootstrap_address(address)
    where = "there" if target == rest else f"at {target}, where Ray connects for it"
    target_host, _, target_port = target.rpartition(":")
    try:
        socket.create_connection((target_host, int(target_port)), timeout=5).close()
    except OSError as exc:
        raise OptionError(f"--address {address}: nothing answers {where} ({exc}); {FIND_THE_ADDRESS}") from None
    if scheme:
        return
    verdict, reason = probe_gcs(target)
    if verdict == "none":
        raise OptionError(f"--address {address}: something answers {where}, but not a Ray cluster: no Ray GCS "
                          f"replied within {GCS_ANSWER_SECONDS} s ({reason}); {FIND_THE_ADDRESS}")
    if verdict == "token":
        raise OptionError(f"--address {address}: Ray's token authentication failed ({reason}); a cluster that uses "
                          "it needs RAY_AUTH_MODE=token here, and its token (`ray get-auth-token` on the head node "
                          "prints it) in RAY_AUTH_TOKEN or ~/.ray/auth_token")


@contextlib.contextmanager
def stderr_into(path: Path):
    """Send this process's stderr (file descriptor 2) to a file for a while: Ray's C++ client logs its
    connection attempts there before Ray's own logging starts, and no setting of Ray's quiets that."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    terminal = os.dup(2)
    try:
        with open(path, "wb") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(terminal, 2)
        os.close(terminal)


class RayExecutor:
    """Runs each job as a Ray task on a cluster (see the module)."""
    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.ray = require_ray()

    def _start(self):
        ray = self.ray
        if self.options.ray_address:
            log = Path(self.options.scratch_dir or tempfile.gettempdir()) / CONNECT_LOG
            try:
                with stderr_into(log):
                    ray.init(address=self.options.ray_address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError, ray.exceptions.RayError) as exc:  # auth too
                reason = " ".join(str(exc).split())[:300] + (f"; Ray's log of it: {log}" if log.stat().st_size else "")
                raise OptionError(f"--address {self.options.ray_address}: no Ray cluster could be reached there "
                                  f"({reason}); {FIND_THE_ADDRESS}") from None
            return
        # A local cluster for this run, its files in the output folder's scratch space, or the zoo's own
        # cache folder when that path is too long for Ray's unix sockets (about 107 characters in all).
        cache = zoo_cache_dir()
        candidates = [Path(self.options.scratch_dir)] if self.options.scratch_dir else []
        temp_dir = next((p for p in [*candidates, cache] if len(str(p.resolve())) < MAX_TEMP_PATH), None)
        temp_dir = temp_dir / "ray" if temp_dir else Path(tempfile.mkdtemp(prefix="zoo-ray-"))
        temp_dir.mkdir(parents=True, exist_ok=True)
        ray.init(num_cpus=os.cpu_count(), num_gpus=None, include_dashboard=False, log_to_driver=False,
                 configure_logging=False, _temp_dir=str(temp_dir.resolve()))

    def job_resources(self) -> dict[str, float]:
        """What one job asks Ray for: the profile's CPU threads (a cuda run's correctness references
        and gradchecks run on them too), and a whole GPU for a cuda job, so no two share one."""
        return {"num_cpus": self.options.profile.threads, "num_gpus": 1 if self.options.profile.device == "cuda" else 0}

    def check_cluster(self) -> None:
        """Ray keeps a task no node can hold pending for ever; refuse such a run with the reason instead."""
        wanted = self.job_resources()
        need = {"CPU": wanted["num_cpus"], "GPU": wanted["num_gpus"]}
        nodes = [node.get("Resources", {}) for node in self.ray.nodes() if node.get("Alive")]
        if any(all(node.get(kind, 0) >= amount for kind, amount in need.items()) for node in nodes):
            return
        cluster = f"the Ray cluster at {self.options.ray_address}" if self.options.ray_address else "the local Ray cluster"
        asked = f"{need['CPU']:g} CPUs (--threads)" + (" and one GPU (--device cuda)" if need["GPU"] else "")
        offered = ", ".join(f"{n.get('CPU', 0):g} CPUs/{n.get('GPU', 0):g} GPUs" for n in nodes) or "no live node"
        raise OptionError(f"--executor ray: each job asks for {asked}, and no node of {cluster} has that (nodes: {offered})")

    def run(self, jobs: list[Job], on_check, on_job) -> None:
        """Start or join the cluster, run every job, report each as it finishes."""
        ray = self.ray
        self._start()
        try:
            self.check_cluster()
            remote = ray.remote(**self.job_resources(), max_retries=0)(_run_job)
            pending = {remote.remote(job, self.options): job for job in jobs}
            while pending:
                [ready], _ = ray.wait(list(pending), num_returns=1)
                job = pending.pop(ready)
                try:
                    records = ray.get(ready)
                except Exception as exc:  # a dead Ray worker or node, or an unserialisable failure
                    reason = " ".join(str(exc).split())[:400]
                    on_job(error_job(job, f"the Ray task failed ({type(exc).__name__}): {reason}"))
                    continue
                for kind, record in records:
                    (on_check if kind == "check" else on_job)(record)
        finally:
            ray.shutdown()
