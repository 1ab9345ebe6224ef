"""The runner: turns a selection into jobs (variant x suite, plain data), hands them to an executor,
and writes each finished job to the store as it arrives.

The local executor runs each variant's jobs in a worker process of its own (a fresh interpreter with
the pinned allocator), under a time limit and a memory cap; a hang, crash or runaway allocation
becomes an ``error`` row for that variant and the run goes on.
"""

from __future__ import annotations

import contextlib
import ctypes
import datetime
import json
import os
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Iterable, Protocol

from .checks import ERROR
from .contract import OptionError
from .environment import ALLOCATOR_ENV, cache_env
from .profiles import Profile
from .registry import Registry, source_hash
from .store import Store


PR_SET_PDEATHSIG = 1
SCRATCH_PREFIX = "zoo-worker-"  # + the runner's pid: a folder whose runner died (kill -9) is removed next run


def remove_stale_scratch() -> list[Path]:
    """Remove worker folders left in the temporary directory by runners that no longer exist."""
    removed = []
    for folder in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*"):
        pid = folder.name[len(SCRATCH_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or _alive(int(pid)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        removed.append(folder)
    return removed


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's process
        return True
    return True


@dataclass(frozen=True)
class Job:
    """One unit of work, as plain data any executor can ship: a variant through one suite."""

    variant: str
    suite: str


@dataclass
class RunOptions:
    """What every worker of a run needs: the profile, limits, plugin folders, where temporary files go."""
    profile: Profile
    timeout_seconds: float
    plugins_dirs: list[str] = field(default_factory=list)
    memory_limit_bytes: int | None = None
    ray_address: str | None = None  # None: start a local Ray cluster for the run
    scratch_dir: str | None = None  # where an executor may keep its temporary files (Ray's)


def now() -> str:
    """The time in UTC, as runs record it."""
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def default_memory_limit() -> int | None:
    """80% of physical memory: a runaway variant is stopped before the machine starts swapping."""
    try:
        return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") * 0.8)
    except (ValueError, OSError, AttributeError):
        return None


def worker_memory_limit(device: str, requested_gib: float | None) -> int | None:
    """The workers' cap on address space (RLIMIT_AS) in bytes, or None for none.

    A cuda run gets none: the CUDA driver reserves far more virtual address space than the machine
    has memory, so any useful cap would stop CUDA from starting; the GPU's own memory bounds it.
    """
    if device == "cuda":
        if requested_gib:
            raise OptionError("--memory-limit: not available with --device cuda (it caps virtual address "
                              "space, and CUDA reserves more of that than the machine has memory)")
        return None
    return int(requested_gib * 2 ** 30) if requested_gib else default_memory_limit()


class Executor(Protocol):
    """What the runner hands jobs to: :class:`LocalExecutor` here, ``RayExecutor`` on a cluster.

    ``run`` executes every job and reports, as they happen, each finished check (``on_check``) and
    each finished job, done or not (``on_job``, with an ``error`` row when the job did not finish).
    """

    def run(self, jobs: list[Job], on_check: Callable[[dict], None], on_job: Callable[[dict], None]) -> None:
        """Run ``jobs``, reporting each finished check and job."""


class LocalExecutor:
    """Runs each variant's jobs in its own worker subprocess, one variant at a time (timings stay clean)."""

    def __init__(self, options: RunOptions) -> None:
        self.options = options

    def run(self, jobs: list[Job], on_check: Callable[[dict], None], on_job: Callable[[dict], None]) -> None:
        """Each variant's jobs in a worker of its own, one variant at a time."""
        remove_stale_scratch()
        by_variant: dict[str, list[Job]] = {}
        for job in jobs:
            by_variant.setdefault(job.variant, []).append(job)
        with CtrlC() as ctrl_c:
            for variant_jobs in by_variant.values():
                run_in_worker(variant_jobs, self.options, on_check, on_job, ctrl_c)
            ctrl_c.check()


class CtrlC:
    """Remembers a Ctrl-C (or a SIGTERM, which stops a run the same way), so the run stops even when its
    KeyboardInterrupt was swallowed: it can land in the fork hooks that run while a worker starts, where
    Python prints it and carries on. The KeyboardInterrupt carries the signal's number."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.pressed: int | None = None
        self._previous: dict[int, object] = {}

    def __enter__(self) -> "CtrlC":
        # Signal handlers live on the main thread. An ignored signal stays ignored: a background job of a
        # script starts with SIGINT ignored, and the shell means it to outlive a Ctrl-C meant for the foreground.
        if threading.current_thread() is threading.main_thread():
            for signum in self.SIGNALS:
                if signal.getsignal(signum) is not signal.SIG_IGN:
                    self._previous[signum] = signal.signal(signum, self._on_signal)
        return self

    def __exit__(self, *exc) -> None:
        for signum, previous in self._previous.items():
            signal.signal(signum, previous)

    def _on_signal(self, signum, frame) -> None:
        self.pressed = signum
        raise KeyboardInterrupt(signum)

    def check(self) -> None:
        """Stop now if a signal came (its KeyboardInterrupt may have been swallowed)."""
        if self.pressed is not None:
            raise KeyboardInterrupt(self.pressed)


def run_in_worker(jobs: list[Job], options: RunOptions, on_check: Callable[[dict], None],
                  on_job: Callable[[dict], None], ctrl_c: CtrlC | None = None) -> None:
    """Run ``jobs`` in one fresh worker process, reporting each finished check and job as it lands;
    a job the worker did not finish (crash, hang, memory) is reported with an ``error`` row."""
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        spec_path, out_path, log_path = (Path(scratch) / name for name in ("spec.json", "out.jsonl", "log.txt"))
        spec_path.write_text(json.dumps({
            "jobs": [asdict(job) for job in jobs],
            "profile": options.profile.as_dict(),
            "plugins_dirs": options.plugins_dirs,
            "memory_limit_bytes": options.memory_limit_bytes,
        }))
        out_path.touch()
        env = {**os.environ, **ALLOCATOR_ENV, **cache_env(), "PYTHONUNBUFFERED": "1"}
        with open(log_path, "w") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "zoo.worker", str(spec_path), str(out_path)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env,
                preexec_fn=_worker_setup(options.memory_limit_bytes), start_new_session=True,
            )
            done: set[tuple[str, str]] = set()
            partial: dict[tuple[str, str], list[dict]] = {}
            deadline = time.monotonic() + options.timeout_seconds
            timed_out = False
            with open(out_path) as out, _killed_on_exit(process):
                while True:
                    if ctrl_c:
                        ctrl_c.check()
                    finished = process.poll() is not None
                    for record in _complete_lines(out):
                        key = (record["variant"], record["suite"])
                        if record["type"] == "check":
                            partial.setdefault(key, []).extend(record["rows"])
                            on_check(record)
                        elif record["type"] == "job":
                            done.add(key)
                            on_job({"variant": key[0], "suite": key[1], "status": "done",
                                    "rows": partial.pop(key, []), "ran_on": record.get("ran_on")})
                    if finished:
                        break
                    if time.monotonic() > deadline:
                        timed_out = True
                        _kill(process)
                    time.sleep(0.05)
        reason = _failure_reason(process.returncode, timed_out, options, log_path)
    for job in jobs:
        if (job.variant, job.suite) not in done:
            rows = partial.pop((job.variant, job.suite), [])
            on_job(error_job(job, reason, rows))


def error_job(job: Job, reason: str, rows: list[dict] | None = None) -> dict:
    """A job record that did not finish: what it had, plus an ``error`` row saying why."""
    return {"variant": job.variant, "suite": job.suite, "status": ERROR,
            "rows": [*(rows or []), {"check": "worker", "status": ERROR, "detail": reason}]}


@contextlib.contextmanager
def _killed_on_exit(process: subprocess.Popen):
    """On Ctrl-C (or any error) in the runner, stop the worker too: it runs in a session of its own."""
    try:
        yield
    finally:
        if process.poll() is None:
            _kill(process)


def _complete_lines(handle) -> Iterable[dict]:
    """New complete JSON lines from a file another process appends to (a partial line waits)."""
    while True:
        position = handle.tell()
        line = handle.readline()
        if not line:
            return
        if not line.endswith("\n"):
            handle.seek(position)
            return
        try:
            yield json.loads(line)
        except json.JSONDecodeError:
            continue


def _worker_setup(memory_limit: int | None):
    """Runs in the worker before it starts: Ctrl-C ignored (the runner stops it), the memory cap, and
    death with its parent (Linux), so a killed run leaves no orphan behind."""

    def apply() -> None:
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle (it stops the worker)
        if memory_limit:
            resource.setrlimit(resource.RLIMIT_AS, (memory_limit, memory_limit))
        if sys.platform.startswith("linux"):
            try:
                ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
            except OSError:
                pass

    return apply


def _kill(process: subprocess.Popen) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _failure_reason(returncode: int, timed_out: bool, options: RunOptions, log_path: Path) -> str:
    log = log_path.read_text(errors="replace").strip().splitlines() if log_path.exists() else []
    last = next((line.strip() for line in reversed(log) if line.strip()), "")
    if timed_out:
        return f"timed out: the variant's jobs took longer than the limit of {options.timeout_seconds:g} s (--timeout)"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        limit = options.memory_limit_bytes
        cap = f" (it ran under a memory cap of {limit / 2 ** 30:.3g} GiB, --memory-limit)" if limit else ""
        return f"worker crashed with signal {name}{cap}" + (f"; last output: {last[:300]}" if last else "")
    if "MemoryError" in last or "DefaultCPUAllocator: can't allocate memory" in last or "not enough memory" in last:
        limit = options.memory_limit_bytes
        cap = f" of {limit / 2 ** 30:.1f} GiB (--memory-limit)" if limit else ""
        return f"out of memory: an allocation went beyond the memory cap{cap}; last output: {last[:300]}"
    if returncode == 0:
        return "worker exited before finishing this job"
    return f"worker exited with status {returncode}" + (f"; last output: {last[:300]}" if last else "")


def plan_jobs(variants: list[str], suites: list[str]) -> list[Job]:
    """One job per (variant, suite)."""
    return [Job(variant, suite) for variant in variants for suite in suites]


def provenance(registry: Registry, variant_name: str) -> dict:
    """Where the variant came from (plugin, distribution, file, source hash) and its card; the runner
    adds where the job ran (``ran_on``)."""
    variant = registry.variant(variant_name)
    data = asdict(variant.origin) if variant.origin else {}
    data["source_sha256"] = source_hash(variant.origin.location if variant.origin else None)
    data["card"] = variant.card()
    return data


def execute(registry: Registry, store: Store, run_id: str, jobs: list[Job], executor: Executor,
            progress: Callable[[str], None] = lambda line: None) -> None:
    """Hand ``jobs`` to ``executor`` and record each in the store as it finishes."""
    checks_per_suite = {suite: len(registry.checks_for(suite)) for suite in {job.suite for job in jobs}}
    counts: dict[tuple[str, str], int] = {}
    started: dict[tuple[str, str], float] = {}
    total, finished = len(jobs), [0]

    def on_check(record: dict) -> None:
        key = (record["variant"], record["suite"])
        started.setdefault(key, time.monotonic() - record["seconds"])
        counts[key] = counts.get(key, 0) + 1
        progress(_bar(finished[0] + 1, total, key, counts[key], checks_per_suite[key[1]]))

    def on_job(record: dict) -> None:
        key = (record["variant"], record["suite"])
        seconds = time.monotonic() - started.get(key, time.monotonic())
        origin = provenance(registry, key[0])
        if record.get("ran_on"):
            origin["ran_on"] = record["ran_on"]
        store.record_job(run_id, key[0], key[1], record["status"], seconds, origin, record["rows"])
        finished[0] += 1
        status = "" if record["status"] == "done" else f"  {record['status'].upper()}: {record['rows'][-1]['detail']}"
        progress(_bar(finished[0], total, key, checks_per_suite[key[1]], checks_per_suite[key[1]]) + f" {seconds:6.1f} s{status}\n")

    executor.run(jobs, on_check, on_job)


def _bar(position: int, total: int, key: tuple[str, str], done: int, of: int, width: int = 20) -> str:
    filled = int(width * done / max(of, 1))
    return f"\r[{position}/{total}] {key[0]:<14} {key[1]:<12} [{'#' * filled}{'.' * (width - filled)}] {done}/{of} checks"
