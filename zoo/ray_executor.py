"""Run the same jobs on a Ray cluster (``zoo run-all --executor ray [--address ADDR]``).

Each job (variant x suite) is one Ray task that asks for the resources it needs (the profile's CPU
threads, and a whole GPU in a cuda run) and runs the job in a fresh worker process exactly as the local
executor does; finished jobs stream back into the same store as Ray reports them. A Ray worker that
dies gives that job an ``error`` row and the run goes on. Ray is an optional extra.
"""

from __future__ import annotations

import os
import socket
import tempfile
from pathlib import Path

from .contract import OptionError
from .environment import zoo_cache_dir
from .runner import Job, RunOptions, error_job, run_in_worker

INSTALL_HINT = "pip install 'attention-zoo[ray]'"
MAX_TEMP_PATH = 40


def require_ray():
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


def check_reachable(address: str) -> None:
    """Fail in seconds when nothing listens at a host:port address (Ray itself retries for minutes)."""
    host, _, port = address.split("://")[-1].rpartition(":")
    if not host or not port.isdigit():
        return  # 'auto' and other forms: Ray judges them
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as exc:
        raise OptionError(f"--address {address}: nothing answers there ({exc}); `ray status` on the cluster's "
                          "head node shows its address, and --address auto finds a cluster started on this machine"
                          ) from None


class RayExecutor:
    def __init__(self, options: RunOptions) -> None:
        self.options = options
        self.ray = require_ray()

    def _start(self):
        ray = self.ray
        if self.options.ray_address:
            try:
                ray.init(address=self.options.ray_address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                reason = " ".join(str(exc).split())[:300]
                raise OptionError(
                    f"--address {self.options.ray_address}: no Ray cluster could be reached there ({reason}); "
                    "`ray status` on its head node shows the address, and --address auto finds a cluster "
                    "started on this machine") from None
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
