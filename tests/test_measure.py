"""FLOP counting (with the fused CPU attention formulas) and deterministic peak memory."""

import pytest
import torch
import torch.nn.functional as F
from conftest import BUILTINS

from zoo.measure import count_flops, peak_memory


def test_fused_cpu_sdpa_is_counted_not_zero():
    q = torch.randn(1, 2, 128, 32)
    assert count_flops(lambda: F.scaled_dot_product_attention(q, q, q)) == 4 * 2 * 128 * 128 * 32


def test_fused_cpu_sdpa_backward_is_counted():
    q = torch.randn(1, 2, 64, 16, requires_grad=True)
    forward = count_flops(lambda: F.scaled_dot_product_attention(q, q, q))
    both = count_flops(lambda: F.scaled_dot_product_attention(q, q, q).sum().backward())
    assert both == forward * 3.5  # torch's backward formula: 5 matmuls against 2


def test_peak_memory_is_deterministic_and_grows_like_the_score_matrix():
    def naive(n):
        q = torch.randn(1, 1, n, 32)
        return peak_memory(lambda: torch.softmax(q @ q.transpose(-1, -2), -1) @ q)

    assert naive(256) == naive(256)
    assert 3.5 < naive(1024) / naive(512) <= 4.1


def test_a_view_of_a_tensor_given_to_the_call_costs_nothing():
    """Slicing a parameter or an input allocates nothing; a copy of the slice does."""
    import torch

    from zoo.measure import peak_memory

    big = torch.zeros(1024, 1024)
    assert peak_memory(lambda: big[:, :16].unbind(0)) == 0
    assert peak_memory(lambda: big[:, :16].contiguous()) == 1024 * 16 * 4


def test_flops_and_peak_memory_in_one_pass_equal_each_counter_alone():
    from zoo.measure import call_counts

    q = torch.randn(2, 4, 96, 16, requires_grad=True)

    def step():
        (torch.softmax(q @ q.transpose(-1, -2), -1) @ q).sum().backward()

    assert call_counts(step)[:2] == (count_flops(step), peak_memory(step))


class _PlainPeakMemory(torch.utils._python_dispatch.TorchDispatchMode):
    """The memory rule written the plain way (pytree over every op's arguments and outputs), to hold the lean
    counter to it."""

    def __init__(self):
        super().__init__()
        self.live, self.current, self.peak = {}, 0, 0

    def _release(self, key):
        self.current -= self.live.pop(key, 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        import weakref

        from torch.utils._pytree import tree_leaves

        out = func(*args, **(kwargs or {}))
        given = {t.untyped_storage().data_ptr() for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)}
        for t in tree_leaves(out):
            if isinstance(t, torch.Tensor) and t.untyped_storage().data_ptr() not in given:
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size and key not in self.live:
                    self.live[key] = size
                    self.current += size
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._release, key)
        return out


@pytest.mark.parametrize("name", BUILTINS)
def test_one_pass_counts_equal_torch_flop_counter_and_the_plain_memory_rule(registry, name):
    """Every callable the speed suite times for a built-in (its baselines and floors too), forward+backward: the
    lean counter's FLOPs, counted ops and peak memory equal FlopCounterMode's and the plain memory rule's."""
    from torch.utils.flop_counter import FlopCounterMode

    from zoo.measure import Counters
    from zoo.profiles import get_profile
    from zoo.suites.speed import _loads_at

    variant = registry.variant(name)
    loads = _loads_at(variant, get_profile("smoke", registry.suites), variant.tags.primary_mode, 64)
    for who, load in loads.items():
        call = load.train_step or load.forward
        call()  # a first call may allocate what later ones reuse (a cached mask): both counters see warm calls
        with FlopCounterMode(display=False) as torch_counter, _PlainPeakMemory() as plain:
            call()
        with Counters() as counters:
            call()
        expected = (torch_counter.get_total_flops(), sorted(map(str, torch_counter.get_flop_counts().get("Global", {}))),
                    plain.peak)
        assert (counters.flops, counters.ops(), counters.peak) == expected, who


def test_a_gather_reads_the_elements_it_selects_and_a_plain_op_its_whole_inputs():
    """Advanced indexing, index_select, gather and embedding count their output's worth of their source (and their
    indices); every other op its inputs whole; no tensor counts for more than all of it."""
    from zoo.measure import bytes_read

    cache = torch.randn(1000, 64)
    rows = torch.tensor([3, 70, 500])
    index_bytes = rows.numel() * rows.element_size()
    selected = 3 * 64 * 4
    assert bytes_read(lambda: cache[rows]) == selected + index_bytes
    assert bytes_read(lambda: cache.index_select(0, rows)) == selected + index_bytes
    assert bytes_read(lambda: torch.nn.functional.embedding(rows, cache)) == selected + index_bytes
    where = rows.view(3, 1).expand(3, 64).contiguous()
    assert bytes_read(lambda: cache.gather(0, where)) == selected + where.numel() * 8
    assert bytes_read(lambda: cache.sum()) == cache.numel() * 4
    assert bytes_read(lambda: (cache[rows], cache[rows])) == selected + index_bytes  # the same gather, once
    assert bytes_read(lambda: cache[:10].sum()) == 10 * 64 * 4  # a slice is a view: the slice is what is read
    every_row_twice = torch.arange(1000).repeat(2)
    assert bytes_read(lambda: cache[every_row_twice]) == cache.numel() * 4 + every_row_twice.numel() * 8
    assert bytes_read(lambda: (cache[rows], cache.sum())) == cache.numel() * 4 + index_bytes  # never past the whole


@pytest.mark.parametrize("name", BUILTINS)
def test_counts_on_fake_tensors_are_a_real_calls_or_none(registry, name):
    """Every callable the complexity suite counts for a built-in, in both phases and every mode it computes, after
    a warm call as the suite makes one: counted on fake tensors, the FLOPs, peak memory and ops of a fresh real
    call, or None (a call that needs a value), never other figures."""
    from zoo.measure import call_counts, counts_on_fake_tensors
    from zoo.workload import modes_for, self_attention_workloads

    variant = registry.variant(name)
    for mode in modes_for(variant, ("full", "causal")):
        def loads():
            return self_attention_workloads(variant, batch=1, d_model=64, heads=1, n=96, causal=mode == "causal",
                                            seed=0, baselines=mode == "full")

        real, fake = loads(), loads()
        for who in real:
            real[who].forward()
            fake[who].forward()
            for phase in ("forward", "train_step"):
                counted = counts_on_fake_tensors(getattr(fake[who], phase))
                assert counted in (None, call_counts(getattr(real[who], phase))), (who, mode, phase)


def test_a_call_that_needs_a_value_is_not_counted_on_fake_tensors_and_a_dense_one_is():
    from zoo.measure import call_counts, counts_on_fake_tensors

    x = torch.randn(64, 32, requires_grad=True)
    assert counts_on_fake_tensors(lambda: x[x.sum(1) > 0] @ x.T) is None  # a shape that depends on the data
    assert counts_on_fake_tensors(lambda: float(x.sum()) * x) is None  # a value
    step = lambda: (torch.softmax(x @ x.T, -1) @ x).sum().backward()  # noqa: E731
    counted = counts_on_fake_tensors(step)
    assert counted == call_counts(step) and counted[0] == 6 * (2 * 64 * 64 * 32)  # two matmuls, four in backward


def test_a_call_is_counted_on_fake_tensors_only_where_its_real_arithmetic_is_predicted_dearer_than_its_faked_ops():
    from zoo.measure import FAKE_SECONDS_PER_OP, cheaper_on_fake_tensors

    assert not cheaper_on_fake_tensors([], 512)  # nothing to predict from: a real call
    per_op = FAKE_SECONDS_PER_OP
    assert cheaper_on_fake_tensors([(256, 2 * per_op * 100, 100)], 512)  # one point: both grow with the length
    assert not cheaper_on_fake_tensors([(256, 0.5 * per_op * 100, 100)], 512)
    quadratic = [(256, 10 * per_op, 200), (512, 40 * per_op, 200)]  # arithmetic grows, ops do not
    assert not cheaper_on_fake_tensors(quadratic, 1024) and cheaper_on_fake_tensors(quadratic, 2048)  # 160, 640: 200
    loop = [(256, 0.25 * per_op * 1000, 1000), (512, 0.25 * per_op * 2000, 2000)]  # cheap ops by the thousand
    assert not cheaper_on_fake_tensors(loop, 65536)


def test_a_counted_call_stops_at_the_op_past_its_cap():
    from zoo.measure import TooManyOps, call_counts

    x = torch.ones(4, requires_grad=True)
    seen = []

    def loop():
        x.grad = None  # each call's backward the same ops
        y = x
        for _ in range(50):
            seen.append(1)
            y = y * 1.5
        y.sum().backward()  # its ops past the cap are stopped too

    with pytest.raises(TooManyOps, match="over 20 ops"):
        call_counts(loop, max_ops=20)
    assert len(seen) == 21  # the 21st multiplication raised
    forward_and_backward = call_counts(loop)[2]
    with pytest.raises(TooManyOps):
        call_counts(loop, max_ops=forward_and_backward - 1)
    assert call_counts(loop, max_ops=forward_and_backward)[2] == forward_and_backward


def test_a_counted_call_stops_at_the_op_whose_output_takes_its_live_tensors_past_the_byte_cap():
    from zoo.measure import TooMuchMemory, call_counts

    made = []

    def grows():
        kept = []
        for size in (1, 2, 4, 8):  # MiB, all kept alive: 1, 3, 7, 15 MiB live
            made.append(size)
            kept.append(torch.ones(size * 2 ** 18))

    assert call_counts(grows, max_bytes=15 * 2 ** 20)[1] == 15 * 2 ** 20
    made.clear()
    with pytest.raises(TooMuchMemory, match="over 0.00488 GiB of tensors live at once"):
        call_counts(grows, max_bytes=5 * 2 ** 20)
    assert made == [1, 2, 4]  # the 4 MiB tensor took them to 7 MiB: nothing after it ran
