"""The environment fingerprint recorded with every run, so results from different runs and machines
can be told apart and compared."""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import platform
import socket
import subprocess
import sys
from pathlib import Path
from typing import Callable

from .checks import ROW_FORM, TIMING_FORM

COMPARABLE_ENVIRONMENT = ("cpu", "cpu_count", "device", "torch", "threads")
"""A run's fingerprint entries that must agree for figures of two runs to share a board (or one resumed run)."""


def machine_kind(environment: dict) -> tuple[str, ...]:
    """A run's fingerprint reduced to :data:`COMPARABLE_ENVIRONMENT`: equal for two runs whose figures may share a
    board."""
    return tuple(str(environment.get(key)) for key in COMPARABLE_ENVIRONMENT)


UNRECORDED_TIMING_FORMS = {"4cb1ce9d62ee": "2"}
"""By ``zoo_commit``, the form of runs that timed in a form they did not record: commit 4cb1ce9 told
nn.MultiheadAttention ``is_causal`` (form 2) before runs recorded their form, and three runs were made on it."""


def timing_form(environment: dict) -> str:
    """How the run called what it timed (:data:`zoo.checks.TIMING_FORM`); for a run that did not record it, "1"
    unless :data:`UNRECORDED_TIMING_FORMS` knows its commit."""
    recorded = environment.get("timing_form")
    return str(recorded) if recorded else UNRECORDED_TIMING_FORMS.get(str(environment.get("zoo_commit")), "1")


def machine_text(environment: dict) -> str:
    """A run's kind of machine in words, every entry :func:`machine_kind` compares ('Intel Xeon (2 cores; cpu, 2
    threads, torch 2.13.0)')."""
    def counted(number, noun: str) -> str:
        return f"{number} {noun}" + ("" if number == 1 else "s")

    details = [text for text in (
        environment.get("device"), environment.get("threads") and counted(environment["threads"], "thread"),
        environment.get("torch") and f"torch {environment['torch']}") if text]
    cores = environment.get("cpu_count") and counted(environment["cpu_count"], "core")
    inside = "; ".join(part for part in (cores, ", ".join(details)) if part)
    return f"{environment.get('cpu') or 'an unnamed machine'}" + (f" ({inside})" if inside else "")


ALLOCATOR_ENV = {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": "100000000000"}
"""glibc settings for benchmark workers: keep freed blocks instead of returning them to the OS, so
memory-hungry variants do not pay page faults on every call."""


RUN_CACHE = "ZOO_RUN_CACHE"
"""Environment variable naming a folder the worker processes of one local run share (the runner sets it), where
what one process worked out for the whole run (a measurement plan, the matmul peak) is read by the next
(:func:`run_shared`)."""


def _shared_file(prefix: str, key: str, suffix: str) -> Path | None:
    """The file ``key`` names in the run's shared folder (:data:`RUN_CACHE`); None without the folder."""
    folder = os.environ.get(RUN_CACHE)
    return Path(folder) / f"{prefix}-{hashlib.sha256(key.encode()).hexdigest()[:32]}{suffix}" if folder else None


def _put_in_place(path: Path, write: Callable[[Path], object], keep: Callable[[Path], bool] = lambda _: True) -> None:
    """``write`` a staging file beside ``path``, then rename it to ``path`` whole where ``keep(staging)`` (so no
    process reads a torn file); a file that cannot be written or is not kept is left to the next process to make."""
    staging = path.with_name(f"{path.name}.{os.getpid()}")
    try:
        write(staging)
        if keep(staging):
            os.replace(staging, path)
    except Exception:  # noqa: BLE001 - not serialisable, or no room: the others make their own
        pass
    finally:
        staging.unlink(missing_ok=True)


def run_shared(key: str, make: Callable[[], object], decode: Callable[[object], object] = lambda data: data):
    """The JSON value ``key`` names, from the run's shared folder (:data:`RUN_CACHE`) if a process of the run made
    it, else ``make()`` now, left there for the others; ``decode`` turns the JSON back into the caller's type in
    every process alike. Without the folder (a single process, the Python API) every call makes its own."""
    path = _shared_file("shared", key, ".json")
    if path:
        try:
            return decode(json.loads(path.read_text()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            pass  # not made yet (or unreadable): make it
    text = json.dumps(make())  # the maker gets what the others will read back, not its own unserialised value
    if path:
        _put_in_place(path, lambda staging: staging.write_text(text))
    return decode(json.loads(text))


def made_once_in_run(key: str, make: Callable[[], object], budget_bytes: int) -> tuple[object, bool]:
    """``make()``'s value (tensors in any nesting ``torch.save`` takes), made once in a run: a process that finds it
    in the run's shared folder (:data:`RUN_CACHE`) reads it back, else makes it and leaves it there for the run's
    other processes while every file left so stays within ``budget_bytes``; and whether it was made here. A value
    that cannot be saved or read back is made in each process. Without the folder every call makes its own.
    Deterministic values only: a process that reads one gets what it would have made."""
    import torch

    path = _shared_file("made", key, ".pt")
    if path and path.exists():
        try:
            return torch.load(path, weights_only=False), False  # the run's own file, written just below
        except Exception:  # noqa: BLE001 - unreadable (a torn write cannot be: it is renamed into place whole)
            pass
    value = make()
    if path and budget_bytes > 0:
        def within_budget(staging: Path) -> bool:
            used = sum(file.stat().st_size for file in path.parent.glob("made-*.pt"))
            return used + staging.stat().st_size <= budget_bytes

        _put_in_place(path, lambda staging: torch.save(value, staging), within_budget)
    return value, True


def counted_once(key: str, count: Callable[[], object], call: Callable[[], object]):
    """``count()`` (a deterministic count that also makes the call it counts) once in a run, shared as
    :func:`run_shared` shares it; a process that reads the count makes ``call()`` plainly instead, so what the call
    does (a cold call, a state advanced by a step) happens in every process, and the slow counted form only once."""
    made = []
    value = run_shared(key, lambda: made.append(True) or count())
    if not made:
        call()
    return value


CACHE_FOLDERS = {
    "TORCH_HOME": "torch", "TORCH_EXTENSIONS_DIR": "torch/extensions", "TORCHINDUCTOR_CACHE_DIR": "torch/inductor",
    "TRITON_CACHE_DIR": "triton", "CUDA_CACHE_PATH": "cuda",
}


def zoo_cache_dir() -> Path:
    """The zoo's own cache folder: $XDG_CACHE_HOME/zoo, else ~/.cache/zoo."""
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "zoo"


def cache_env() -> dict[str, str]:
    """Environment for a worker: torch's caches (hub downloads, compiled extensions, inductor, Triton,
    the CUDA JIT) in the zoo's cache folder of the machine it runs on, not scattered in the home
    folder; a variable the user has set is left alone."""
    root = zoo_cache_dir()
    return {name: str(root / folder) for name, folder in CACHE_FOLDERS.items() if name not in os.environ}


def cpu_model() -> str:
    """The CPU's model name (what figures are comparable across)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def git_commit() -> str:
    """The zoo's own commit when it runs from a git checkout ('' for an installed release)."""
    here = Path(__file__).resolve().parent
    try:
        out = subprocess.run(["git", "-C", str(here), "rev-parse", "--short=12", "HEAD"],
                             capture_output=True, text=True, timeout=5)
        dirty = subprocess.run(["git", "-C", str(here), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return ""
    if out.returncode != 0:
        return ""
    return out.stdout.strip() + ("+dirty" if dirty.stdout.strip() else "")


GPU_NAME = "import torch; print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'unavailable')"


def device_label(device: str, in_this_process: bool = True) -> str:
    """'cpu', or the GPU's model for cuda ('cuda (NVIDIA H200)'): what timings are comparable across.

    Asking CUDA for the name creates a CUDA context; the runner asks in a child process instead, so it
    holds none (a GPU in exclusive-process mode admits a single process: the worker)."""
    if device == "cpu":
        return device
    if in_this_process:
        import torch

        return f"{device} ({torch.cuda.get_device_name() if torch.cuda.is_available() else 'unavailable'})"
    try:
        name = subprocess.run([sys.executable, "-c", GPU_NAME], capture_output=True, text=True,
                              timeout=120).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = ""
    return f"{device} ({name or 'unavailable'})"


def machine(device: str) -> dict[str, str]:
    """Where a job ran (recorded per job: on a Ray cluster that need not be the machine that started the run)."""
    import torch

    here = {"host": socket.gethostname(), "cpu": cpu_model(), "device": device_label(device), "torch": torch.__version__}
    if device == "cuda":
        here["cuda"] = str(torch.version.cuda)
    return here


def fingerprint(profile, device: str) -> dict[str, str]:
    """What a run records of where it ran: versions, CPU, threads, device, allocator, host."""
    import torch

    import zoo

    return {
        "zoo_version": zoo.__version__,
        "zoo_commit": git_commit(),
        "torch": torch.__version__,
        "python": platform.python_version(),
        "cpu": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "threads": str(profile.threads),
        "device": device_label(device, in_this_process=False),
        **({"cuda": str(torch.version.cuda)} if device == "cuda" else {}),
        "allocator": " ".join(f"{k}={v}" for k, v in ALLOCATOR_ENV.items()),
        "profile": profile.name,
        "host": socket.gethostname(),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "row_form": ROW_FORM,
        "timing_form": TIMING_FORM,
    }
