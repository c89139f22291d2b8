"""From a rollout (TrajectoryBatch + rewards) to the arrays the train step consumes.

Everything stays token ids: loss roles come from the router ψ applied to the ids (the same pure
function the sampler ran incrementally), the loss mask is the rollout's (1 on sampled tokens only)
times CEA's role mask, and rows are padded to a multiple of `pad_multiple` so the jitted step sees
few distinct shapes. Route ids: a rollout's batch (`build_batch`) carries the ones the sampler
recorded (what its forward used), checked equal to the method's routes of ψ(ids); a demonstration's
(`token_arrays`, SFT) are the method's routes of ψ(ids).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec, role_token_mask, routes_for
from dart_jax.rl.advantages import group_index, grpo_advantages
from dart_jax.roles.router import RouterSpec, loss_roles, route_roles
from dart_jax.rollout.trajectory import TrajectoryBatch


def round_up(n: int, multiple: int) -> int:
    return ((n + multiple - 1) // multiple) * multiple


AnswerTags = tuple  # (opening-tag id sequences, closing-tag id sequences): rollout.protocol.tag_variants


def answer_span_mask(tokens: np.ndarray, tags: AnswerTags) -> np.ndarray:
    """bool[B, T]: tokens of every answer span, from the first token of an opening tag through the
    last token of the next closing tag (an unclosed span runs to the end). A tag matches as any of
    its token sequences (BPE writes `<answer>` differently after a space, a newline, a word)."""
    opens, closes = tags
    if not opens or not closes:
        raise ValueError("answer_span_mask needs at least one opening and one closing tag sequence")

    def ends(seqs):  # bool[B, T]: some sequence of `seqs` ends at t; and its length there
        hit = np.zeros(tokens.shape, bool)
        length = np.zeros(tokens.shape, np.int64)
        for seq in sorted(seqs, key=len):
            k = len(seq)
            if k > tokens.shape[1]:
                continue
            m = np.ones((tokens.shape[0], tokens.shape[1] - k + 1), bool)
            for j, x in enumerate(seq):
                m &= tokens[:, j:tokens.shape[1] - k + 1 + j] == x
            hit[:, k - 1:] |= m
            length[:, k - 1:] = np.where(m, k, length[:, k - 1:])  # the longest match wins
        return hit, length

    o_hit, o_len = ends(opens)
    c_hit, _ = ends(closes)
    out = np.zeros(tokens.shape, bool)
    for b in range(tokens.shape[0]):
        start = -1
        for t in np.nonzero(o_hit[b] | c_hit[b])[0]:
            if start < 0 and o_hit[b, t]:
                start = t - o_len[b, t] + 1
            elif start >= 0 and c_hit[b, t]:
                out[b, start:t + 1] = True
                start = -1
        if start >= 0:
            out[b, start:] = True
    return out


def token_arrays(ids: np.ndarray, positions: np.ndarray, loss_mask: np.ndarray, method: MethodSpec,
                 router: RouterSpec, pad_multiple: int = 64, answer_tags: AnswerTags | None = None
                 ) -> dict[str, np.ndarray]:
    """Right-padded id rows -> {tokens, positions, route_ids, loss_roles, loss_mask} padded to a
    multiple of `pad_multiple`: the part of a batch RL and SFT share. `answer_tags`: the answer
    tags' id sequences, needed by role_mask "answer"."""
    width = ids.shape[1]
    length = round_up(width, pad_multiple)
    pad = ((0, 0), (0, length - width))
    tokens = np.pad(ids, pad)
    positions = np.pad(positions, pad, constant_values=-1)
    valid = jnp.asarray(positions >= 0)
    roles = route_roles(jnp.asarray(tokens), router, valid)
    lroles = jnp.where(valid, loss_roles(roles), -1)
    routes = routes_for(method, roles)
    span = None
    if method.role_mask == "answer":
        if answer_tags is None:
            raise ValueError("role_mask 'answer' needs answer_tags (the protocol's answer tag sequences)")
        span = jnp.asarray(answer_span_mask(tokens, answer_tags) & np.asarray(valid))
    mask = np.pad(loss_mask, pad) * np.asarray(role_token_mask(method, lroles, span))
    return {"tokens": tokens.astype(np.int32), "positions": positions.astype(np.int32),
            "route_ids": np.asarray(routes, np.int32), "loss_roles": np.asarray(lroles, np.int32),
            "loss_mask": mask.astype(np.float32)}


def build_batch(tb: TrajectoryBatch, scores: np.ndarray, method: MethodSpec, router: RouterSpec,
                pad_multiple: int = 64, norm_adv_by_std: bool = True, valid: np.ndarray | None = None,
                answer_tags: AnswerTags | None = None) -> dict[str, np.ndarray]:
    """-> {tokens, positions, route_ids (the recorded ones: `recorded_routes`), loss_roles, loss_mask,
    sampler_logp [N, L]; advantages, scores, group (the row's GRPO group, dense ids) [N]} as numpy
    arrays. Rows with `valid` False (their prompt's reference failed) keep their place, so the batch
    layout does not change, but carry no loss: mask and advantage 0."""
    out = token_arrays(tb.ids, tb.positions, tb.loss_mask, method, router, pad_multiple, answer_tags)
    pad = ((0, 0), (0, out["tokens"].shape[1] - tb.ids.shape[1]))
    out["route_ids"] = recorded_routes(np.pad(tb.route_ids, pad, constant_values=-1), out["route_ids"])
    ids, groups = group_index(tb.uids)
    adv = grpo_advantages(jnp.asarray(scores, jnp.float32), jnp.asarray(ids), groups, norm_adv_by_std)
    if valid is not None and not np.all(valid):
        adv = np.where(valid, np.asarray(adv), 0.0)
        out["loss_mask"] = out["loss_mask"] * np.asarray(valid, np.float32)[:, None]
    out.update(sampler_logp=np.pad(tb.sampler_logprobs, pad).astype(np.float32),
               advantages=np.asarray(adv, np.float32), scores=np.asarray(scores, np.float32),
               group=ids)
    return out


def recorded_routes(recorded: np.ndarray, expected: np.ndarray) -> np.ndarray:
    """The route ids a rollout recorded (i32[N, L], −1 on padding), after checking that they are the
    method's routes of ψ over the ids (`expected`, `token_arrays`): the forward the trainer runs must
    route each position as the sampler did. Raises ValueError naming the first row that differs."""
    bad = np.nonzero(np.any(recorded != expected, axis=1))[0]
    if bad.size:
        b = int(bad[0])
        raise ValueError(f"{bad.size} trajectories' recorded route ids differ from the method's routes of the router "
                         f"over their ids (row {b}: recorded {recorded[b].tolist()}, router {expected[b].tolist()}): "
                         "the rollout was routed differently from how the trainer's forward routes it")
    return recorded.astype(np.int32)


def minibatches(batch: dict[str, np.ndarray], order: np.ndarray, mini_batch: int, micro_batch: int,
                keys: tuple[str, ...]):
    """Yield {key: [M, micro_batch, ...]} for consecutive mini-batches of `order`."""
    n = len(order)
    if n % mini_batch or mini_batch % micro_batch:
        raise ValueError(f"{n} trajectories per step must split into mini-batches of {mini_batch} and those "
                         f"into micro-batches of {micro_batch}")
    m = mini_batch // micro_batch
    for start in range(0, n, mini_batch):
        rows = order[start:start + mini_batch]
        yield {k: batch[k][rows].reshape((m, micro_batch) + batch[k].shape[1:]) for k in keys}


def micro_batches_apart(mb: dict[str, np.ndarray], pad_multiple: int, share_prefix: bool
                        ) -> list[dict[str, np.ndarray]]:
    """A micro-batched mini-batch {key: [M, b, T] or [M, b]} -> M single micro-batches {key: [1, b, ...]},
    each cut to its own rows' extent (right padding past its longest row dropped, the width rounded up
    to `pad_multiple`) or, with `share_prefix`, split around its own common prefix
    (`split_shared_prefix`): padded to its own longest row, not the mini-batch's. Padding carries
    no loss, so the micro-batch's loss and gradient are the same up to rounding."""
    out = []
    t = mb["tokens"].shape[2]
    for i in range(mb["tokens"].shape[0]):
        valid = np.any(mb["positions"][i] >= 0, axis=0)
        width = min(t, round_up(int(np.nonzero(valid)[0].max()) + 1 if valid.any() else 1, pad_multiple))
        one = {k: (v[i:i + 1, :, :width] if v.ndim == 3 and v.shape[2] == t else v[i:i + 1]) for k, v in mb.items()}
        # split after the cut: a split that forwards no fewer tokens than the cut rows is not taken
        out.append(split_shared_prefix(one, pad_multiple) if share_prefix else one)
    return out


# -- shared prefixes ----------------------------------------------------------------------------------
PREFIX_KEYS = ("prefix_tokens", "prefix_positions", "prefix_route_ids")
_PAD = {"tokens": 0, "positions": -1, "route_ids": -1, "loss_roles": -1}


def shared_prefix_length(tokens: np.ndarray, positions: np.ndarray, route_ids: np.ndarray,
                         loss_mask: np.ndarray) -> int:
    """Rows [b, T] of one micro-batch -> c: the columns [0, c) every row holds identically (tokens,
    positions, routes) and no token 0..c carries loss — so the first c columns can run once for the
    micro-batch and each row continue from column c (the log-prob of token c, which a row's own
    forward would take from column c − 1, is never needed)."""
    same = np.all((tokens == tokens[:1]) & (positions == positions[:1]) & (route_ids == route_ids[:1]), axis=0)
    common = int(np.argmin(same)) if not same.all() else tokens.shape[1]
    lossy = np.any(loss_mask > 0, axis=0)
    first_loss = int(np.argmax(lossy)) if lossy.any() else tokens.shape[1]
    return max(0, min(common, first_loss - 1))


def split_shared_prefix(mb: dict[str, np.ndarray], pad_multiple: int) -> dict[str, np.ndarray]:
    """A micro-batched mini-batch {key: [M, b, T] or [M, b]} -> the same loss with each
    micro-batch's common prefix run once: PREFIX_KEYS [M, 1, P] (the prefix of each micro-batch,
    padded with position −1) and every [M, b, T] array cut to its rows' continuation [M, b, S]
    from column c_m (`shared_prefix_length`), P and S rounded up to `pad_multiple`. For a GRPO
    micro-batch of one group, the prefix is the group's prompt: the forward and backward pass
    over it run once instead of b times, with identical results (the prompt's hidden states do
    not depend on what follows; its gradient is the sum of the rows'). Returns `mb` unchanged when
    no micro-batch shares a prefix, or when the padded prefix and continuations would not be fewer
    tokens than the rows (one micro-batch with little in common sets the continuation width for all)."""
    tokens = mb["tokens"]
    m, b, t = tokens.shape
    cuts = np.asarray([shared_prefix_length(tokens[i], mb["positions"][i], mb["route_ids"][i], mb["loss_mask"][i])
                       for i in range(m)])
    if cuts.max() == 0:
        return mb
    ends = np.where(np.any(mb["positions"] >= 0, axis=2), t - np.argmax((mb["positions"] >= 0)[..., ::-1], axis=2), 0)
    p_width = round_up(int(cuts.max()), pad_multiple)
    s_width = round_up(int(max(1, (ends - cuts[:, None]).max())), pad_multiple)
    if p_width + b * s_width >= b * t:  # padded tokens forwarded per micro-batch: no saving
        return mb
    cols = cuts[:, None] + np.arange(s_width)[None, :]          # [M, S] source column of each suffix column
    inside = cols < t
    src = np.minimum(cols, t - 1)
    out: dict[str, np.ndarray] = {}
    for key, v in mb.items():
        if v.ndim != 3 or v.shape[2] != t:
            out[key] = v
            continue
        cut = np.take_along_axis(v, np.broadcast_to(src[:, None, :], (m, b, s_width)), axis=2)
        out[key] = np.where(inside[:, None, :], cut, np.asarray(_PAD.get(key, 0), v.dtype)).astype(v.dtype)
    pre = np.arange(p_width)[None, :] < cuts[:, None]             # [M, P]
    for key, name in zip(("tokens", "positions", "route_ids"), PREFIX_KEYS):
        head = np.zeros((m, p_width), mb[key].dtype)
        w = min(p_width, t)
        head[:, :w] = mb[key][:, 0, :w]
        out[name] = np.where(pre, head, np.asarray(_PAD[key], mb[key].dtype))[:, None, :]
    return out


def group_order(group_ids: np.ndarray, rng: np.random.Generator | None) -> np.ndarray:
    """Row order that keeps each group's rows together (in their order), the groups permuted by
    `rng` (None: first-seen order) — so micro-batches of group_size rows are whole groups."""
    groups = list(dict.fromkeys(group_ids.tolist()))
    if rng is not None:
        groups = [groups[i] for i in rng.permutation(len(groups))]
    return np.concatenate([np.nonzero(group_ids == g)[0] for g in groups])
