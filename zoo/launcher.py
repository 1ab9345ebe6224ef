"""Fresh worker processes without the wait for ``import torch``: a launcher interpreter imports torch and the
worker once, then forks each worker from that state when the runner asks.

A worker is still a process of its own (its own memory, session, time limit, memory cap and crash), started in the
runner's folder with the workers' environment; only the imports are shared. An interpreter needs about 3 s of CPU to
import torch on the 2-core machines the zoo runs on, a fork milliseconds, and a run starts a worker per variant and
one per further timing process. The launcher runs no torch operation before it forks, so no OpenMP thread pool
exists yet (a process forked after one parallel matmul hung in its first one, here) and each worker sets its own
thread count as a fresh interpreter would; what a library reads once as it loads (the allocator's settings,
OpenMP's) comes from the launcher's environment, which is the workers'. Elsewhere than on Linux the forked child
executes a fresh interpreter instead (torch's libraries are not known to survive a fork there).

``python -m zoo.launcher`` reads one JSON request per line on stdin and answers each with two lines on stdout:
the worker's pid as it starts, then its exit status as :attr:`subprocess.Popen.returncode` gives one.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib
import json
import os
import random
import resource
import select
import signal
import subprocess
import sys
import traceback
from pathlib import Path

PRELOADED = ("torch", "torch._dynamo", "zoo.worker", "zoo.registry")
"""Imported before any fork, with the zoo's own suites: what every worker imports (no plugin: a plugin is a worker's
to load, where its failure costs that worker only). ``torch._dynamo`` is imported lazily by torch itself on the
first call of some functions (entering FlopCounterMode is one): every job of every suite paid it, 1.1-1.9 s per
worker under ``python -X importtime``."""
PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Linux: this process is killed when its parent dies, so a killed run leaves no orphan behind."""
    if sys.platform.startswith("linux"):
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        except OSError:
            pass


INTERRUPTS = {signal.SIGINT, signal.SIGTERM}


@contextlib.contextmanager
def _interrupts_held():
    """Ctrl-C and SIGTERM held back from this thread while it forks, and delivered after: Python runs its fork
    hooks there (logging's), and a KeyboardInterrupt raised inside one is printed and lost, so the run would go on
    (the runner's :class:`~zoo.runner.CtrlC` covers its own forks, not the harness's first launcher's)."""
    held = hasattr(signal, "pthread_sigmask")
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, INTERRUPTS) if held else None
    try:
        yield
    finally:
        if held:
            signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _in_child() -> None:
    """In the launcher's process before it runs: it dies with its parent, and takes signals as a fresh one would."""
    die_with_parent()
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, INTERRUPTS)


class Worker:
    """A started worker, read like :class:`subprocess.Popen`: ``pid``, :meth:`poll`, :meth:`wait`, ``returncode``
    (a signal that ended it as its negative number; a launcher that died under it reads as SIGKILL)."""

    def __init__(self, launcher: "Launcher", pid: int | None) -> None:
        self.pid, self.returncode, self._launcher = pid, None, launcher

    def poll(self) -> int | None:
        """The exit status if the worker has ended, else None."""
        if self.returncode is None:
            self.returncode = self._launcher.exit_status(block=False)
        return self.returncode

    def wait(self) -> int:
        """Wait for the worker to end; its exit status."""
        if self.returncode is None:
            self.returncode = self._launcher.exit_status(block=True)
        return self.returncode


class Launcher:
    """The runner's side: starts the launcher interpreter (once, or again if it died) and asks it for workers,
    one at a time."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self._env, self._log_path, self._process = env, log_path, None

    def ready(self) -> "Launcher":
        """The launcher interpreter started, if it is not running: it dies with the thread that starts it (the
        parent-death signal is the starting thread's), so a runner that hands it to another thread starts it first."""
        if self._process is None or self._process.poll() is not None:
            with open(self._log_path, "a") as log, _interrupts_held():  # unbuffered pipes: a reply is never read
                self._process = subprocess.Popen([sys.executable, "-m", "zoo.launcher"], bufsize=0,  # ahead of select
                                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                                                 env=self._env, start_new_session=True, preexec_fn=_in_child)
        return self

    def start(self, args: list[str], log_path: Path, memory_limit: int | None) -> Worker:
        """A fresh worker running ``python -m zoo.worker ARGS``, its output to ``log_path``, under the memory cap."""
        self.ready()
        request = {"args": list(map(str, args)), "log": str(log_path), "memory_limit": memory_limit}
        try:
            self._process.stdin.write((json.dumps(request) + "\n").encode())
            self._process.stdin.flush()
        except BrokenPipeError:
            pass  # it died while starting: the reply below says so
        reply = self._reply(block=True)
        if reply is None:  # it died before forking (torch would not import, say): a worker that did, as it said
            with open(log_path, "a") as log:
                log.write(self._log_path.read_text(errors="replace") if self._log_path.exists() else "")
            worker = Worker(self, None)
            worker.returncode = self._process.wait()
            return worker
        return Worker(self, reply["pid"])

    def exit_status(self, block: bool) -> int | None:
        """The running worker's exit status (None: still running and ``block`` is false)."""
        reply = self._reply(block)
        if reply is None:
            return None if self._process.poll() is None else -signal.SIGKILL
        return reply["returncode"]

    def _reply(self, block: bool) -> dict | None:
        stdout = self._process.stdout
        if not block and not select.select([stdout], [], [], 0)[0]:
            return None
        line = stdout.readline()
        return json.loads(line) if line.endswith(b"\n") else None

    def close(self) -> None:
        """Stop the launcher (a worker it started is the caller's to stop first)."""
        if self._process is not None and self._process.poll() is None:
            self._process.stdin.close()
            try:
                self._process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        if self._process is not None:
            self._process.stdout.close()

    def __enter__(self) -> "Launcher":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _become_worker(request: dict) -> int:
    """In the forked child: set up as a fresh worker would be, then run it; its exit status."""
    os.setsid()  # a session of its own: the runner kills it and anything it starts as one group
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the runner's to handle (it stops the worker)
    die_with_parent()
    if request["memory_limit"]:
        resource.setrlimit(resource.RLIMIT_AS, (request["memory_limit"], request["memory_limit"]))
    with open(os.devnull) as nothing, open(request["log"], "a") as log:
        os.dup2(nothing.fileno(), 0)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    if not sys.platform.startswith("linux"):  # forking a process that loaded torch is known safe on Linux only
        os.execv(sys.executable, [sys.executable, "-m", "zoo.worker", *request["args"]])
    random.seed()  # a fresh interpreter's draws, not the launcher's
    sys.argv = [sys.executable, *request["args"]]
    try:
        from .worker import main
        return main(request["args"])
    except SystemExit as stop:  # as the interpreter ends on one: a message is printed and the status is 1
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def serve() -> None:
    """The launcher's loop: import, then fork a worker per request and report its pid and exit status."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for module in PRELOADED:
        importlib.import_module(module)
    from .registry import core_modules

    for module in core_modules():
        importlib.import_module(module)
    replies = sys.stdout
    for line in sys.stdin:
        request = json.loads(line)
        replies.flush()
        pid = os.fork()
        if pid == 0:
            status = 1
            try:
                status = _become_worker(request)
            finally:
                os._exit(status)
        replies.write(json.dumps({"pid": pid}) + "\n")
        replies.flush()
        _, status = os.waitpid(pid, 0)
        replies.write(json.dumps({"returncode": os.waitstatus_to_exitcode(status)}) + "\n")
        replies.flush()
    os._exit(0)  # nothing left to say: skip unloading torch, 0.8 s of every run's end and of every Ctrl-C's


if __name__ == "__main__":
    serve()
