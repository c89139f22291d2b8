"""The engine's row and width bookkeeping (dart_jax/serve/slots.py), by hand: exact row pieces and
observation widths."""

import pytest

from dart_jax.rollout.gather import row_bucket
from dart_jax.serve.slots import obs_width, obs_widths, row_buckets, row_pieces


@pytest.mark.parametrize("n,slots,want", [(1, 32, [1]), (5, 32, [4, 1]), (17, 32, [16, 1]),
                                          (31, 32, [16, 8, 4, 2, 1]), (32, 32, [32]), (5, 5, [5]), (3, 5, [2, 1]),
                                          (4, 5, [4])])
def test_row_pieces_cover_the_rows_exactly_with_compiled_buckets(n, slots, want):
    assert row_pieces(n, slots) == want


def test_every_piece_is_a_row_bucket_and_the_pieces_sum_to_the_rows():
    for slots in range(1, 70):
        for n in range(1, slots + 1):
            pieces = row_pieces(n, slots)
            assert sum(pieces) == n and set(pieces) <= set(row_buckets(slots)), (n, slots, pieces)
            assert max(pieces) <= row_bucket(n, slots)


def test_observation_widths_are_powers_of_two_then_quarter_octaves():
    assert [obs_width(n) for n in (1, 16, 17, 200, 256, 257, 320, 321, 390, 512, 513, 1000)] == \
        [16, 16, 32, 256, 256, 320, 320, 384, 448, 512, 640, 1024]
    assert obs_widths(1024) == [16, 32, 64, 128, 256, 320, 384, 448, 512, 640, 768, 896, 1024]
    assert obs_widths(500) == [16, 32, 64, 128, 256, 320, 384, 448, 512]
    for n in range(1, 5000):  # the smallest listed width that fits, and a fixed point
        w = obs_width(n)
        assert w >= n and obs_width(w) == w and w in obs_widths(n)
        assert n <= 256 or w - n < w // 5, (n, w)  # above 256 columns, less than a fifth is padding
