"""SFT batch order: every epoch a seeded permutation cut into batches; with group_by_length, batches
of similar lengths in a shuffled order (less padding, same rows)."""

import numpy as np

from dart_jax.sft.trainer import GROUP_CHUNK, epoch_batches


def _padded(lengths, batches):
    return sum(int(lengths[b].max()) * len(b) for b in batches)


def test_plain_order_is_a_seeded_permutation():
    lengths = np.arange(50)
    a = epoch_batches(lengths, 8, seed=3, epoch=1, group_by_length=False)
    assert len(a) == 6 and all(len(b) == 8 for b in a)
    assert len(set(np.concatenate(a).tolist())) == 48
    assert all((x == y).all() for x, y in zip(a, epoch_batches(lengths, 8, 3, 1, False)))
    assert any((x != y).any() for x, y in zip(a, epoch_batches(lengths, 8, 3, 2, False)))


def test_group_by_length_keeps_rows_and_cuts_padding():
    rng = np.random.default_rng(0)
    lengths = rng.integers(100, 1200, size=8 * GROUP_CHUNK * 3 + 5)  # three chunks and a partial one
    plain = epoch_batches(lengths, 8, 0, 0, False)
    grouped = epoch_batches(lengths, 8, 0, 0, True)
    assert len(grouped) == len(plain) == len(lengths) // 8
    rows = np.concatenate(grouped)
    assert len(set(rows.tolist())) == len(rows)  # no row twice in an epoch
    # within a batch the lengths are close: one chunk sorted and cut
    assert _padded(lengths, grouped) < 0.8 * _padded(lengths, plain)
    # deterministic per (seed, epoch), and the batch order is shuffled (not longest first)
    again = epoch_batches(lengths, 8, 0, 0, True)
    assert all((x == y).all() for x, y in zip(grouped, again))
    maxima = [int(lengths[b].max()) for b in grouped]
    assert maxima != sorted(maxima, reverse=True)
