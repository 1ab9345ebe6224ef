"""zoo.decoding's caches: append grows one without copying and never writes into a tensor it did not make; a window
cache keeps the last entries as a ring, overwriting the oldest in place."""

import pytest
import torch

from zoo.decoding import GROWTH_FACTOR, MIN_CAPACITY, append, counted_bytes


def test_append_equals_concatenation_and_moves_to_new_storage_only_when_full():
    cache, tokens, moves, where = None, [], 0, None
    for step in range(200):
        token = torch.randn(2, 3, 1, 4)
        tokens.append(token)
        cache = append(cache, token, 2)
        moves += cache.untyped_storage().data_ptr() != where
        where = cache.untyped_storage().data_ptr()
        assert torch.equal(cache, torch.cat(tokens, 2))
        assert cache.untyped_storage().nbytes() <= max(MIN_CAPACITY, (step + 1) * GROWTH_FACTOR) * 2 * 3 * 4 * 4
    assert moves <= 30  # geometric growth: a new buffer every ~25% more tokens, not one per token
    assert counted_bytes({"k": cache, "position": 200}) == 200 * 2 * 3 * 4 * 4


def test_append_copies_a_tensor_it_did_not_make_instead_of_writing_past_its_end():
    whole = torch.zeros(1, 10)
    grown = append(whole[:, :4], torch.full((1, 1), -1.0), 1)
    assert whole[0, 4] == 0 and grown[0, 4] == -1 and grown.shape == (1, 5)
    empty = torch.zeros(1, 5)
    append(empty[:, :0], torch.full((1, 1), -7.0), 1)
    assert empty[0, 0] == 0


def test_append_refuses_a_token_of_another_dtype_or_shape_in_one_line():
    cache = append(None, torch.zeros(2, 1, 3), 1)
    with pytest.raises(ValueError, match="does not extend"):
        append(cache, torch.zeros(2, 1, 3, dtype=torch.float64), 1)
    with pytest.raises(ValueError, match="does not extend"):
        append(cache, torch.zeros(1, 1, 3), 1)


@pytest.mark.parametrize("prompt", [0, 2, 5, 9])
def test_a_window_cache_holds_the_last_window_entries_and_overwrites_the_oldest_in_place(prompt):
    from zoo.decoding import push_window, window_cache

    window, positions = 4, torch.arange(12.0).view(1, 12, 1)
    cache = window_cache(positions[:, :prompt], window, 1)
    for t in range(prompt, 12):
        before = cache.untyped_storage().data_ptr()
        cache = push_window(cache, positions[:, t:t + 1], t, window, 1)
        assert sorted(cache.flatten().tolist()) == list(map(float, range(max(0, t + 1 - window), t + 1)))
        assert [cache[0, slot, 0].item() % window for slot in range(cache.shape[1])] == list(range(cache.shape[1]))
        if t >= window:  # full: the newest took the oldest's slot, in the same storage
            assert cache.untyped_storage().data_ptr() == before
