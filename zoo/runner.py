"""The runner: turns a selection into jobs (variant x suite x process, plain data), hands them to an executor,
and writes each finished job to the store as it arrives (a repeated one again, combined, with each process).

The local executor runs each variant's jobs in a worker process of its own (a fresh process with the pinned
allocator, forked from the run's :mod:`launcher <zoo.launcher>`, which imported torch once), under a time
limit and a memory cap; a hang, crash or runaway allocation becomes an ``error`` row for that variant and the
run goes on. A check that gives a ``combine`` (a timing) is repeated in further fresh processes, each a pass
over every variant after all first processes, and a (variant, suite) is stored when its first process is in
and again, combined, with each further one (:func:`combine_processes`).
"""

from __future__ import annotations

import collections
import contextlib
import datetime
import json
import os
import queue
import shutil
import signal
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Protocol

from .checks import ERROR, WORKER_CHECK, Result, describe_exception, undeclared
from .contract import OptionError
from .environment import ALLOCATOR_ENV, RUN_CACHE, cache_env
from .launcher import Launcher, Worker
from .profiles import Profile
from .registry import Registry, source_hash
from .store import Store


SCRATCH_PREFIX = "zoo-worker-"  # + the runner's pid: a folder whose runner died (kill -9) is removed next run


def shared_parent() -> str | None:
    """Where a run's shared folder (:data:`zoo.environment.RUN_CACHE`) goes: in memory (``/dev/shm``) where the
    machine has it, so what one timing process leaves there for the next (the inference suite's prefilled states,
    hundreds of MiB) is never written back to a disk while a later one is timed; else the temporary directory."""
    memory = Path("/dev/shm")
    return str(memory) if memory.is_dir() and os.access(memory, os.W_OK | os.X_OK) else None


def run_folder() -> tempfile.TemporaryDirectory:
    """The folder a local run's workers share, removed as the run ends."""
    return tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-run-", dir=shared_parent())


def remove_stale_scratch() -> list[Path]:
    """Remove worker and run folders left in the temporary directory or in memory by runners that no longer
    exist."""
    removed = []
    parents = dict.fromkeys(Path(parent) for parent in (tempfile.gettempdir(), shared_parent()) if parent)
    for folder in (folder for parent in parents for folder in parent.glob(f"{SCRATCH_PREFIX}*-*")):
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
    """One unit of work, as plain data any executor can ship: a variant through one suite, in one of the run's
    fresh processes (``process``: 0 runs every check of the suite; 1, 2, ... run again only the checks that
    give a ``combine``, timings, whose figures move between processes)."""

    variant: str
    suite: str
    process: int = 0
    side_by_side: bool = False  # its suite's rows do not hang on what else runs (zoo.Suite.side_by_side)


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
    each finished job, done or not (``on_job``: its ``checks`` as (check name, rows) pairs, and a ``failure``
    row when the job did not finish; :func:`run_in_worker` and :func:`error_job` make both).
    """

    def run(self, jobs: list[Job], on_check: Callable[[dict], None], on_job: Callable[[dict], None]) -> None:
        """Run ``jobs``, reporting each finished check and job."""


class LocalExecutor:
    """Runs the side-by-side jobs first, in :data:`LANES` workers at once with the run's threads shared between
    them; then the rest one worker at a time (timings stay clean), in the order the jobs come: each variant's
    first-process jobs in a worker of its own; each further process's repeats of every variant in one fresh worker
    (a pass). A worker that crashed or hung is followed by a new one without the job that stopped it. A job whose
    first process crashed or hung is not repeated."""

    def __init__(self, options: RunOptions, launchers: "Launchers | None" = None) -> None:
        self.options, self.launchers = options, launchers

    def run(self, jobs: list[Job], on_check: Callable[[dict], None], on_job: Callable[[dict], None]) -> None:
        """The side-by-side jobs, then each variant's first process, then each further process's pass."""
        remove_stale_scratch()
        beside = [job for job in jobs if job.side_by_side and job.process == 0]
        by_worker: dict[tuple[str, int], list[Job]] = {}
        for job in jobs:
            if not (job.side_by_side and job.process == 0):
                by_worker.setdefault((job.variant if job.process == 0 else "", job.process), []).append(job)
        failed: set[tuple[str, str]] = set()  # a first process that crashed or hung: its repeats would too

        def noting(record: dict) -> None:
            if record.get("failure") and not record.get("process"):
                failed.add((record["variant"], record["suite"]))
            on_job(record)

        with CtrlC() as ctrl_c, contextlib.nullcontext(self.launchers) if self.launchers else Launchers() as launchers:
            shared, launcher = launchers.shared, launchers.lane(0)
            if beside:
                self._side_by_side(beside, on_check, noting, ctrl_c, shared, launchers)
            for (variant, _), worker_jobs in by_worker.items():
                for job in [job for job in worker_jobs if (job.variant, job.suite) in failed]:
                    on_job({"variant": job.variant, "suite": job.suite, "process": job.process, "status": "done",
                            "checks": []})  # not repeated: nothing to combine
                worker_jobs = [job for job in worker_jobs if (job.variant, job.suite) not in failed]
                while worker_jobs:
                    worker_jobs = run_in_worker(worker_jobs, self.options, on_check, noting, ctrl_c, shared_dir=shared,
                                                launcher=launcher)
            ctrl_c.check()

    def _side_by_side(self, jobs: list[Job], on_check, on_job, ctrl_c: "CtrlC", shared: str, launchers: "Launchers"):
        """``jobs`` in lanes, each with a launcher of its own and its share of the run's threads, taking the next
        variant's jobs when it is free (one variant's can take ten times another's) and running them in a worker of
        their own; every record is handed on from this thread, so the store is written from one, and a lane takes
        its next variant once the last one's jobs are stored."""
        todo: queue.Queue = queue.Queue()
        for variant in dict.fromkeys(job.variant for job in jobs):
            todo.put([job for job in jobs if job.variant == variant])
        lanes = min(LANES, todo.qsize())
        threads = max(1, self.options.profile.threads // lanes)
        options = replace(self.options, profile=self.options.profile.with_overrides(threads=threads))
        events: queue.Queue = queue.Queue()
        stop = _Stop(ctrl_c)

        def drive(lane_launcher: Launcher) -> None:
            try:
                while True:
                    try:
                        jobs = todo.get_nowait()
                    except queue.Empty:
                        return
                    while jobs:
                        jobs = run_in_worker(jobs, options, lambda record: events.put((on_check, record)),
                                             lambda record: events.put((on_job, record)), stop, shared_dir=shared,
                                             launcher=lane_launcher)
                    stored = threading.Event()  # its jobs are in the store before the lane's next worker starts
                    events.put((lambda _: stored.set(), None))
                    while not stored.wait(0.2):
                        stop.check()
            except BaseException as exc:  # stopped (Ctrl-C, or the run failed): the run's thread says why
                events.put((None, exc))
            finally:
                events.put((None, None))

        workers = [threading.Thread(target=drive, args=(launchers.lane(index),), daemon=True) for index in range(lanes)]
        for worker in workers:
            worker.start()
        running, failure = len(workers), None
        try:
            while running:
                try:
                    callback, record = events.get(timeout=0.2)
                except queue.Empty:
                    ctrl_c.check()
                    continue
                if callback is not None:
                    callback(record)
                elif record is None:  # a lane is done
                    running -= 1
                elif failure is None:
                    failure = record
        finally:
            stop.stopped = True  # a lane still running (this thread failed) stops its worker
            for worker in workers:
                worker.join()
        if failure is not None:
            raise failure


LANES = 2
"""Side-by-side jobs run in this many workers at once (the zoo's machines have two cores)."""


class Launchers:
    """A local run's shared folder (:func:`run_folder`) and its launchers (:mod:`zoo.launcher`), one per lane,
    each started when first asked for (:meth:`lane`) and stopped with the folder. The harness makes them before it
    loads the plugins, so the first launcher's import of torch overlaps the runner's own start instead of following
    it (3-4 s on the zoo's 2-core machines), and asks for the other lanes' as soon as it knows the run has
    side-by-side jobs: a launcher importing torch while a timed job runs would be load on its timings."""

    def __init__(self) -> None:
        self._folder = run_folder()
        self.shared = self._folder.name
        self._started: dict[int, Launcher] = {}
        self.lane(0)

    def lane(self, index: int) -> Launcher:
        """Lane ``index``'s launcher, started (again, if it died)."""
        if index not in self._started:
            name = "launcher.txt" if index == 0 else f"launcher-{index}.txt"
            self._started[index] = Launcher(worker_env(self.shared), Path(self.shared) / name)
        return self._started[index].ready()

    def close(self) -> None:
        """Stop every launcher, then remove the folder."""
        try:
            for launcher in self._started.values():
                launcher.close()
        finally:
            self._folder.cleanup()

    def __enter__(self) -> "Launchers":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class _Stop:
    """What a lane's worker loop checks: the run's Ctrl-C, or the run's thread having stopped."""

    def __init__(self, ctrl_c: "CtrlC") -> None:
        self.ctrl_c, self.stopped = ctrl_c, False

    def check(self) -> None:
        self.ctrl_c.check()
        if self.stopped:
            raise KeyboardInterrupt(signal.SIGTERM)


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


def worker_env(shared_dir: str | None = None) -> dict[str, str]:
    """The environment workers run in: the runner's, the pinned allocator, torch's caches in the zoo's folder,
    unbuffered output (a crash leaves its last words in the log), and the folder the run's workers share
    (:data:`zoo.environment.RUN_CACHE`)."""
    return {**os.environ, **ALLOCATOR_ENV, **cache_env(), "PYTHONUNBUFFERED": "1",
            **({RUN_CACHE: shared_dir} if shared_dir else {})}


def run_in_worker(jobs: list[Job], options: RunOptions, on_check: Callable[[dict], None],
                  on_job: Callable[[dict], None], ctrl_c: CtrlC | None = None,
                  shared_dir: str | None = None, launcher: Launcher | None = None) -> list[Job]:
    """Run ``jobs`` in one fresh worker process, reporting each finished check and job as it lands. The time
    limit is each job's; a job the worker did not finish (crash, hang, memory) is reported with an ``error``
    row, and the jobs after it, which never ran, are returned for a new worker (so a slow quality job never
    costs a variant its other suites). ``shared_dir``: the folder the run's workers share
    (:data:`zoo.environment.RUN_CACHE`); ``launcher``: the run's (:mod:`zoo.launcher`; None: one for this worker
    alone)."""
    with tempfile.TemporaryDirectory(prefix=f"{SCRATCH_PREFIX}{os.getpid()}-") as scratch:
        spec_path, out_path, log_path = (Path(scratch) / name for name in ("spec.json", "out.jsonl", "log.txt"))
        spec_path.write_text(json.dumps({
            "jobs": [asdict(job) for job in jobs],
            "profile": options.profile.as_dict(),
            "plugins_dirs": options.plugins_dirs,
            "memory_limit_bytes": options.memory_limit_bytes,
        }))
        out_path.touch()
        with contextlib.ExitStack() as stack:
            if launcher is None:  # a worker on its own (a Ray task's): a launcher for it alone
                launcher = stack.enter_context(Launcher(worker_env(shared_dir), Path(scratch) / "launcher.txt"))
            process = launcher.start([spec_path, out_path], log_path, options.memory_limit_bytes)
            done: set[tuple[str, str, int]] = set()
            partial: dict[tuple[str, str, int], list[tuple[str, list[dict]]]] = {}
            deadline = time.monotonic() + options.timeout_seconds
            timed_out = False
            with open(out_path) as out, _killed_on_exit(process):
                while True:
                    if ctrl_c:
                        ctrl_c.check()
                    finished = process.poll() is not None
                    for record in _complete_lines(out):
                        key = (record["variant"], record["suite"], record.get("process", 0))
                        if record["type"] == "check":
                            partial.setdefault(key, []).append((record["check"], record["rows"]))
                            on_check(record)
                        elif record["type"] == "job":
                            done.add(key)
                            deadline = time.monotonic() + options.timeout_seconds
                            on_job({"variant": key[0], "suite": key[1], "process": key[2], "status": "done",
                                    "checks": partial.pop(key, []), "ran_on": record.get("ran_on")})
                    if finished:
                        break
                    if time.monotonic() > deadline:
                        timed_out = True
                        _kill(process)
                    time.sleep(0.05)
        kind, reason = _failure_reason(process.returncode, timed_out, options, log_path)
    undone = [job for job in jobs if (job.variant, job.suite, job.process) not in done]
    for job in undone[:1]:
        on_job(error_job(job, reason, partial.pop((job.variant, job.suite, job.process), []), kind))
    return undone[1:]


UNFINISHED = ("timed out", "out of memory", "crashed", "exited early", "lost its worker")
"""The kinds of a job its worker did not finish, as the failure row's ``params["unfinished"]`` names them: what a
board says where the job's figures are missing."""


def error_job(job: Job, reason: str, checks: list[tuple[str, list[dict]]] | None = None,
              kind: str = "lost its worker") -> dict:
    """A job record that did not finish: the checks it had finished, and the ``error`` row saying why (``kind``:
    one of :data:`UNFINISHED`, ``reason`` the whole story)."""
    return {"variant": job.variant, "suite": job.suite, "process": job.process, "status": ERROR,
            "checks": list(checks or []), "failure": {"check": WORKER_CHECK, "status": ERROR, "detail": reason,
                                                      "params": {"unfinished": kind}}}


@contextlib.contextmanager
def _killed_on_exit(process: Worker):
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


def _kill(process: Worker) -> None:
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    process.wait()


def _failure_reason(returncode: int, timed_out: bool, options: RunOptions, log_path: Path) -> tuple[str, str]:
    """Why a worker did not finish its job: its kind (:data:`UNFINISHED`) and the whole reason."""
    log = log_path.read_text(errors="replace").strip().splitlines() if log_path.exists() else []
    last = next((line.strip() for line in reversed(log) if line.strip()), "")
    if timed_out:
        return "timed out", f"timed out: the job took longer than the limit of {options.timeout_seconds:g} s (--timeout)"
    if returncode is not None and returncode < 0:
        name = signal.Signals(-returncode).name if -returncode in signal.Signals._value2member_map_ else str(-returncode)
        limit = options.memory_limit_bytes
        cap = f" (it ran under a memory cap of {limit / 2 ** 30:.3g} GiB, --memory-limit)" if limit else ""
        return "crashed", f"worker crashed with signal {name}{cap}" + (f"; last output: {last[:300]}" if last else "")
    if "MemoryError" in last or "DefaultCPUAllocator: can't allocate memory" in last or "not enough memory" in last:
        limit = options.memory_limit_bytes
        cap = f" of {limit / 2 ** 30:.1f} GiB (--memory-limit)" if limit else ""
        return "out of memory", f"out of memory: an allocation went beyond the memory cap{cap}; last output: {last[:300]}"
    if returncode == 0:
        return "exited early", "worker exited before finishing this job"
    return "exited early", f"worker exited with status {returncode}" + (f"; last output: {last[:300]}" if last else "")


def plan_jobs(variants: list[str], suites: list[str], processes: Mapping[str, int] | None = None,
              side_by_side: Iterable[str] = ()) -> list[Job]:
    """One job per (variant, suite), then one more per further process of a suite measured in several
    (``processes``: suite -> how many; 1 when absent): every variant's first process comes before any second
    one, so the processes of a variant's timings lie a whole pass over the variants apart, as a rerun's would.
    ``side_by_side``: the suites whose first-process jobs may run beside others (:attr:`zoo.Suite.side_by_side`)."""
    processes, side_by_side = processes or {}, set(side_by_side)
    jobs = [Job(variant, suite, 0, suite in side_by_side) for variant in variants for suite in suites]
    for process in range(1, max(processes.values(), default=1)):
        jobs += [Job(variant, suite, process) for variant in variants for suite in suites
                 if processes.get(suite, 1) > process]
    return jobs


def processes_per_suite(registry: Registry, suites: list[str], processes: int) -> dict[str, int]:
    """How many processes measure each suite: ``processes`` for one with a check that gives a combine, else 1."""
    return {suite: processes if any(check.combine for check in registry.checks_for(suite)) else 1 for suite in suites}


def combine_processes(registry: Registry, profile: Profile, records: list[dict]) -> list[dict]:
    """A job's rows from the records of its processes (process 0 first): a check that gives a combine, and ran
    in more than one of them, gets its rows combined across those; any other check keeps the rows of the first
    process that ran it; each process's failure row (a crash, a time limit) is kept. A combine that raises
    costs its check an error row, never the run."""
    variant_name, suite = records[0]["variant"], records[0]["suite"]
    checks = {check.name: check for check in registry.checks_for(suite)}
    kinds = registry.suite(suite).row_kinds(checks.values())
    ran: dict[str, list[list[dict]]] = {}
    for record in records:
        for name, rows in record["checks"]:
            ran.setdefault(name, []).append(rows)
    out: list[dict] = []
    for name, per_process in ran.items():
        check = checks.get(name)
        if check is None or check.combine is None or len(per_process) == 1:
            out += per_process[0]
            continue
        try:
            variant = registry.variant(variant_name).with_defaults(profile.variant_options)
            combined = list(check.combine(variant, profile, [[Result(**row) for row in rows] for rows in per_process]))
            out += [row.as_dict() for row in combined + undeclared(check, [row.check for row in combined], kinds)]
        except Exception as exc:
            out += [*per_process[0], Result(name, ERROR, detail=f"combining the rows of {len(per_process)} processes "
                                                               f"failed: {describe_exception(exc)}").as_dict()]
    return out + [record["failure"] for record in records if record.get("failure")]


def provenance(registry: Registry, variant_name: str, options: Mapping[str, Any] | None = None) -> dict:
    """Where the variant came from (plugin, distribution, file, source hash) and its card, with the run's own
    option defaults (``options``: its ``--option``s); the runner adds where the job ran (``ran_on``)."""
    variant = registry.variant(variant_name).with_defaults(options or {})
    data = asdict(variant.origin) if variant.origin else {}
    data["source_sha256"] = source_hash(variant.origin.location if variant.origin else None)
    data["card"] = variant.card()
    return data


def execute(registry: Registry, store: Store, run_id: str, jobs: list[Job], executor: Executor, profile: Profile,
            progress: Callable[[str], None] = lambda line: None) -> None:
    """Hand ``jobs`` to ``executor`` and record each (variant, suite) in the store as its first process finishes,
    and again, combined with them (:func:`combine_processes`), as each further one does, their seconds added up:
    a run stopped between passes keeps every first process's rows (``--resume`` does not repeat those)."""
    checks_in = {(suite, repeat): len([c for c in registry.checks_for(suite) if not repeat or c.combine])
                 for suite in {job.suite for job in jobs} for repeat in (False, True)}
    expected = collections.Counter((job.variant, job.suite) for job in jobs)
    counts: dict[tuple[str, str, int], int] = {}
    started: dict[tuple[str, str, int], float] = {}
    held: dict[tuple[str, str], list[tuple[dict, float]]] = {}
    total, finished, last_event = len(jobs), [0], [time.monotonic()]  # a job with no check in began at the last end
    last_output, last_job = [time.monotonic()], [None]  # when a line was last printed, about which job

    def on_check(record: dict) -> None:
        key = (record["variant"], record["suite"], record.get("process", 0))
        started.setdefault(key, time.monotonic() - record["seconds"])
        counts[key] = counts.get(key, 0) + 1
        last_output[0], last_job[0] = time.monotonic(), key
        progress(_bar(finished[0] + 1, total, key, counts[key], checks_in[key[1], key[2] > 0]))

    def store_job(job: tuple[str, str]) -> None:
        records = sorted(held[job], key=lambda item: item[0].get("process", 0))
        origin = provenance(registry, job[0], profile.variant_options)
        if records[0][0].get("ran_on"):
            origin["ran_on"] = records[0][0]["ran_on"]
        rows = combine_processes(registry, profile, [record for record, _ in records])
        done = all(record["status"] == "done" for record, _ in records)
        store.record_job(run_id, job[0], job[1], "done" if done else ERROR, sum(s for _, s in records), origin, rows)

    def on_job(record: dict) -> None:
        key = (record["variant"], record["suite"], record.get("process", 0))
        seconds = time.monotonic() - started.get(key, last_event[0])
        last_event[0] = last_output[0] = time.monotonic()
        job = key[:2]
        held.setdefault(job, []).append((record, seconds))
        # stored as soon as its first process is in (a run stopped later keeps it), again with each further one,
        # and always before the line that says it finished
        store_job(job)
        if len(held[job]) == expected[job]:
            del held[job]
        finished[0] += 1
        failure = record.get("failure")
        status = f"  {record['status'].upper()}: {failure['detail']}" if failure else ""
        of = checks_in[key[1], key[2] > 0]
        done = counts.get(key, 0) if failure else of  # a job its worker did not finish shows how far it got
        progress(_bar(finished[0], total, key, done, of) + f" {seconds:6.1f} s{status}\n")

    def still_running(quiet: float) -> str:
        key = last_job[0]
        since = f"since a check last finished (of {key[0]} {key[1]})" if key else "since the run began"
        return f"\r[{finished[0]}/{total}] still running: {quiet:.0f} s {since}\n"

    with _heartbeat(progress, Heartbeat(still_running, lambda: last_output[0])):
        executor.run(jobs, on_check, on_job)


HEARTBEAT_SECONDS = 60.0  # a run that has printed nothing for this long says it is still running


@dataclass
class Heartbeat:
    """When a run has printed nothing for ``every`` seconds (a check of a long job, one quality training, can take
    minutes), the line that says it is still running: ``line(quiet seconds)``; ``last_output()``: when it last
    printed (``time.monotonic``)."""

    line: Callable[[float], str]
    last_output: Callable[[], float]
    every: float | None = None  # None: HEARTBEAT_SECONDS
    said: float = float("-inf")

    def due(self, now: float) -> str | None:
        """The line to print at ``now``, if one is due (each quiet stretch gets one every ``every`` seconds)."""
        every = HEARTBEAT_SECONDS if self.every is None else self.every
        since = max(self.last_output(), self.said)
        if now - since < every:
            return None
        self.said = now
        return self.line(now - self.last_output())


@contextlib.contextmanager
def _heartbeat(progress: Callable[[str], None], heartbeat: Heartbeat):
    """While the body runs, print each line ``heartbeat`` says is due, looking once a second (or sooner)."""
    stop = threading.Event()

    def beat() -> None:
        every = HEARTBEAT_SECONDS if heartbeat.every is None else heartbeat.every
        while not stop.wait(min(every, 1.0)):
            if line := heartbeat.due(time.monotonic()):
                progress(line)

    thread = threading.Thread(target=beat, name="zoo-heartbeat", daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


def _bar(position: int, total: int, key: tuple[str, str, int], done: int, of: int, width: int = 20) -> str:
    filled = int(width * done / max(of, 1))
    suite = key[1] + (f" #{key[2] + 1}" if key[2] else "")
    return f"\r[{position}/{total}] {key[0]:<14} {suite:<12} [{'#' * filled}{'.' * (width - filled)}] {done}/{of} checks"
