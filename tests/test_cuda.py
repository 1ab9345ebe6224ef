"""The CUDA paths; skipped with the reason where no GPU is present (scripts/gpu-check runs them)."""


import pandas as pd
import pytest
import torch

from conftest import BUILTINS, run_python, run_zoo
from zoo.api import default_registry
from zoo.cases import cases_for
from zoo.profiles import get_profile
from zoo.store import Store

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device on this machine")

GPU_FLOAT32_TOLERANCE = 1e-4  # GPU float32 kernels (cuBLAS without TF32, SDPA's float32 path) vs float64


def zoo_run(out, *args):
    done = run_zoo("run-all", "--device", "cuda", "--profile", "smoke", "--out", out, *args, timeout=1200)
    assert done.returncode == 0, done.stderr[-3000:]
    return pd.read_csv(out / "results.csv"), Store(out / "results.sqlite")


@pytest.fixture(scope="module")
def smoke_run(tmp_path_factory):
    return zoo_run(tmp_path_factory.mktemp("cuda"))


def test_correctness_passes_on_cuda_including_low_precision_and_the_device_itself(smoke_run):
    results, _ = smoke_run
    correctness = results[results.suite == "correctness"]
    assert set(correctness.status) <= {"passed", "skipped"}, correctness[correctness.status == "failed"].to_dict("records")
    on_gpu = correctness[correctness.check == "dtype-device"]
    assert on_gpu.setting.str.endswith("on cuda").any() and set(on_gpu.status) == {"passed"}
    low = correctness[correctness.check == "reference-low-precision"]
    assert low.setting.str.contains("on cuda").all() and set(low.status) == {"passed"}


def test_speed_records_the_cuda_sdpa_kernel_and_synchronised_times(smoke_run):
    results, _ = smoke_run
    backends = results[results.check == "sdpa-backend"].detail.dropna()
    assert backends.str.contains("scaled_dot_product").any() and not backends.str.contains("for_cpu").any()
    # That every clock reading waits for the GPU is tested without a GPU (tests/test_scaling.py), not by a
    # window on how fast this GPU is.
    assert (results[results.check == "matmul-peak"].value > 0).all()
    times = results[(results.check == "time") & (results.versus == "") & (results.variant == "dot-product")].value
    assert not times.empty and (times > 0).all()


def test_complexity_counts_cuda_kernels_and_reads_the_allocator(smoke_run):
    results, store = smoke_run
    assert (results[results.check == "cuda-allocator-peak"].value > 0).all()
    readme = (store.path.parent / "README.md").read_text()
    assert "### GPU memory" in readme and "_for_cpu" not in readme
    exponent = results[(results.variant == "dot-product") & (results.check == "flops-exponent")]
    assert set(exponent.status) == {"passed"} and (exponent.value > 1.75).all()  # the fused kernels are counted


def test_each_job_records_the_gpu_it_ran_on(smoke_run):
    _, store = smoke_run
    jobs = store.jobs(store.latest_run())
    assert all(p["ran_on"]["device"].startswith("cuda (") for p in jobs.provenance)


@pytest.mark.parametrize("name", BUILTINS)
def test_builtins_match_their_float64_reference_in_float32_on_cuda(name):
    from zoo.suites.correctness import _reference_errors

    variant = default_registry().variant(name)
    for case in cases_for(variant):
        worst, seed = max(_reference_errors(variant, case, [0, 1], torch.float32, "cuda"))
        assert worst < GPU_FLOAT32_TOLERANCE, (case.describe(), seed, worst)


def test_quality_trains_on_cuda():
    from zoo.suites.quality import hyper_parameters, train
    from zoo.tasks import default_tasks

    hp = {**hyper_parameters(get_profile("smoke")), "steps": 5}
    outcome = train(default_registry().variant("dot-product"), default_tasks()[0], hp, 0, device="cuda")
    score, seconds = outcome.accuracy, outcome.seconds
    assert 0 <= score <= 1 and seconds > 0


def test_ray_gives_each_cuda_job_a_gpu(tmp_path):
    pytest.importorskip("ray", reason="the Ray executor is an optional extra: pip install 'attention-zoo[ray]'")
    results, store = zoo_run(tmp_path, "--executor", "ray", "--filter", "dot-product", "--suite", "correctness")
    assert not results.empty and set(results.status) <= {"passed", "skipped"}
    assert all(p["ran_on"]["device"].startswith("cuda (") for p in store.jobs(store.latest_run()).provenance)


def test_the_runner_names_the_gpu_without_holding_a_cuda_context():
    code = ("import torch; from zoo.environment import fingerprint; from zoo.profiles import get_profile; "
            "device = fingerprint(get_profile('smoke'), 'cuda')['device']; "
            "print(device if not torch.cuda.is_initialized() else 'context created')")
    out = run_python("-c", code, timeout=300)
    assert out.stdout.startswith("cuda (") and "unavailable" not in out.stdout, out.stdout + out.stderr
