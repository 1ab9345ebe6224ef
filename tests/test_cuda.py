"""The CUDA paths; skipped with the reason where no GPU is present (scripts/gpu-check runs them)."""

import subprocess
import sys

import pandas as pd
import pytest
import torch

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")


def test_a_smoke_run_on_cuda_records_backend_allocator_peak_and_low_precision(tmp_path):
    out = subprocess.run([sys.executable, "-m", "zoo", "run-all", "--device", "cuda", "--profile", "smoke",
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr
    results = pd.read_csv(tmp_path / "results.csv")
    backends = results[results.check == "sdpa-backend"].detail.dropna()
    assert backends.str.contains("scaled_dot_product").any() and not backends.str.contains("for_cpu").any()
    assert (results.check == "cuda-allocator-peak").any()
    low = results[results.check == "reference-low-precision"]
    assert low.setting.str.contains("on cuda").all() and set(low.status) == {"passed"}
    correctness = results[results.suite == "correctness"]
    assert set(correctness.status) <= {"passed", "skipped"}
