"""A worker: runs jobs (variant x suite) described by plain data, in a fresh process (forked by the run's
:mod:`zoo.launcher`, or an interpreter of its own).

``python -m zoo.worker SPEC OUT`` reads the JSON spec, and appends one JSON line to OUT per finished
check and per finished job. Results never travel over stdout, so a plugin that prints cannot corrupt them.
"""

from __future__ import annotations

import json
import sys
import time
from typing import IO

from .checks import run_check
from .contract import UnknownVariantError
from .profiles import Profile


def run_jobs(spec: dict, out: IO[str]) -> None:
    """Run the spec's jobs, one JSON line per finished check and job."""
    import torch

    from .environment import machine
    from .registry import load_registry

    profile = Profile.from_dict(spec["profile"])
    torch.set_num_threads(profile.threads)
    registry = load_registry(spec.get("plugins_dirs", []))
    ran_on = machine(profile.device)

    def emit(record: dict) -> None:
        out.write(json.dumps(record) + "\n")
        out.flush()

    for job in spec["jobs"]:
        if job["variant"] not in registry.variants:  # it loaded in the runner but not here: say why
            failures = "; ".join(f.message() for f in registry.failures) or "no plugin failure was recorded"
            raise UnknownVariantError(f"variant {job['variant']!r} did not load in the worker ({failures})")
        variant = registry.variant(job["variant"]).with_defaults(profile.variant_options)
        process = job.get("process", 0)  # a further process repeats only the checks whose rows it combines
        checks = registry.checks_for(job["suite"])
        kinds = registry.suite(job["suite"]).row_kinds(checks)
        for check in checks:
            if process and check.combine is None:
                continue
            started = time.perf_counter()
            rows = run_check(check, variant, profile, spec.get("memory_limit_bytes"), kinds)
            emit({"type": "check", "variant": variant.name, "suite": job["suite"], "process": process,
                  "check": check.name, "seconds": time.perf_counter() - started, "rows": [r.as_dict() for r in rows]})
        emit({"type": "job", "variant": variant.name, "suite": job["suite"], "process": process, "ran_on": ran_on})


def main(argv: list[str] | None = None) -> int:
    """python -m zoo.worker SPEC OUT."""
    spec_path, out_path = (argv or sys.argv[1:])[:2]
    with open(spec_path) as handle:
        spec = json.load(handle)
    with open(out_path, "a") as out:
        run_jobs(spec, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
