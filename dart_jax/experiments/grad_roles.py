"""Per-role gradients for gradient alignment (the paper's interference analysis): one backward pass per role, so a
role's gradient never shares a graph with the other's.

The loss of role r on a set of trajectories is the GRPO surrogate restricted to role-r tokens,
aggregated as the trainer does (token-mean over the kept tokens), evaluated at the current policy
(old log-probs = the current ones: ratio 1, nothing clipped), no KL or entropy term. Its gradient is
that of

    L_r = − Σ_t w_t · m_t^r · log π(y_t)  /  Σ_t m_t^r

computed directly (one forward and one backward; no pass for old log-probs), with w_t = the
trajectory's GRPO advantage (`weighting="advantage"`) or 1 (`"loglik"`: the log-likelihood gradient,
advantage-free). m^r is the role mask of rl.batch (`reasoning`: every generated token outside tool
spans; `tool`: inside them, the closing tag included; `answer`: the final answer span, the DART
authors' M_Reas role). `tags_in_tool` adds the opening tag to the tool role (the authors' tool-span
mask, "tags included"; the router gives it to reasoning, whose position predicts it). The gradient is
with respect to the trainable tree of `method`: the whole backbone (variant `full`: the paper's
`params=full`) or the adapters (`dart` / `lora`); with `wrt="base"` and an adapter method, with respect
to the backbone of the adapted policy (the adapters held fixed: `params=full` on a trained DART policy).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from dart_jax.adapters.method import MethodSpec
from dart_jax.analysis.grad_angles import WEIGHTINGS
from dart_jax.rl.batch import token_arrays
from dart_jax.rl.step import policy_trees, sequence_logprobs

ROLES = ("reasoning", "tool", "answer")


class RoleGradients:
    """grads(params, base, ids, positions, loss_mask, advantages, role) -> gradient tree (fp32, like the
    trainable `params`; like `base` when `wrt="base"`) of L_role over the given rows (one trajectory: the
    paper's per-trajectory gradient; a group: the authors' per-group gradient)."""

    def __init__(self, cfg, method: MethodSpec, router, weighting: str = "advantage", temperature: float = 1.0,
                 chunk: int = 128, pad_multiple: int = 64, answer_tags=None, tags_in_tool: bool = False,
                 wrt: str = "trainable"):
        if weighting not in WEIGHTINGS:
            raise ValueError(f"weighting {weighting!r}; expected one of {WEIGHTINGS}")
        if wrt not in ("trainable", "base"):
            raise ValueError(f"wrt {wrt!r}; expected 'trainable' or 'base'")
        if wrt == "base" and (method.trains_base or method.variant == "2agent"):
            raise ValueError(f"wrt='base' differentiates the backbone under fixed adapters; method "
                             f"{method.variant!r} has no adapters to hold fixed (use wrt='trainable')")
        if method.isolation != "forward":
            raise ValueError("per-role gradients come from separate passes: use isolation='forward' (a strict "
                             "method splits each pass again)")
        self.cfg, self.method, self.router, self.weighting, self.wrt = cfg, method, router, weighting, wrt
        self.pad_multiple, self.answer_tags, self.tags_in_tool = pad_multiple, answer_tags, tags_in_tool
        def loss(params, base, tokens, positions, routes, mask, w):
            # the surrogate's value at ratio 1 is −Σ w·m / Σ m; its gradient is that of −Σ w·m·log π / Σ m
            fwd_base, fwd_ads = policy_trees(method, params, base)
            logp, _ = sequence_logprobs(fwd_base, fwd_ads, tokens, positions, routes, cfg=cfg,
                                        temperature=temperature, chunk=chunk)
            return -jnp.sum(w[:, None] * mask * logp) / jnp.sum(mask)

        self._grad = jax.jit(jax.grad(loss, argnums=1 if wrt == "base" else 0))

    def arrays(self, ids: np.ndarray, positions: np.ndarray, loss_mask: np.ndarray, role: str) -> dict:
        """Token arrays of the rows with the loss mask restricted to `role`."""
        if role not in ROLES:
            raise ValueError(f"role {role!r}; expected one of {ROLES}")
        arr = token_arrays(ids, positions, loss_mask, dataclasses.replace(self.method, role_mask=role), self.router,
                           self.pad_multiple, self.answer_tags)
        if role == "tool" and self.tags_in_tool:
            # the opening tag is predicted from a reasoning position (the router's loss role); the DART
            # authors' tool-span mask includes it (their "tags included")
            opening = np.isin(arr["tokens"], np.asarray(self.router.open_ids))
            sampled = np.pad(np.asarray(loss_mask, np.float32), ((0, 0), (0, arr["tokens"].shape[1] - ids.shape[1])))
            arr["loss_mask"] = np.maximum(arr["loss_mask"], (opening & (sampled > 0)).astype(np.float32))
        return arr

    def __call__(self, params, base, ids: np.ndarray, positions: np.ndarray, loss_mask: np.ndarray,
                 advantages: np.ndarray, role: str, key: jax.Array | None = None):
        """-> (gradient tree, number of role tokens). A role with no tokens in these rows has no gradient:
        (None, 0). `key` is unused (no dropout in an analysis pass); kept for call compatibility."""
        arr = self.arrays(ids, positions, loss_mask, role)
        return self._masked(params, base, arr, arr["loss_mask"], advantages)

    def _masked(self, params, base, arr: dict, mask: np.ndarray, advantages: np.ndarray):
        """The gradient of the loss over the token arrays `arr` with `mask` as the loss mask: (tree, tokens), or
        (None, 0) for an empty mask."""
        n = float(mask.sum())
        if n == 0:
            return None, 0
        rows = arr["tokens"].shape[0]
        adv = np.ones(rows, np.float32) if self.weighting == "loglik" else np.asarray(advantages, np.float32)
        grads = self._grad(params, base, *(jnp.asarray(arr[k]) for k in ("tokens", "positions", "route_ids")),
                           jnp.asarray(mask, jnp.float32), jnp.asarray(adv))
        return grads, int(n)

    def random_split(self, params, base, ids: np.ndarray, positions: np.ndarray, loss_mask: np.ndarray,
                     advantages: np.ndarray, rng: np.random.Generator):
        """The role-agnostic control: the rows' reasoning and tool tokens together, split uniformly at random into
        two sets of the two roles' sizes (set A as many tokens as the reasoning role, set B as the tool role),
        each set's gradient as a role's. -> [(tree A, tokens), (tree B, tokens)]; both (None, 0) when either
        role has no tokens (the cross-role pair is undefined then too). The token-mean losses make
        |A|·g_A + |B|·g_B = |R|·g_R + |T|·g_T exactly (tests/experiments/test_grad_roles.py)."""
        reasoning = self.arrays(ids, positions, loss_mask, "reasoning")
        tool = self.arrays(ids, positions, loss_mask, "tool")
        k_r, k_t = int(reasoning["loss_mask"].sum()), int(tool["loss_mask"].sum())
        if k_r == 0 or k_t == 0:
            return [(None, 0), (None, 0)]
        both = (reasoning["loss_mask"] > 0) | (tool["loss_mask"] > 0)
        pick = rng.permutation(np.flatnonzero(both.ravel()))[:k_r]
        a = np.zeros(both.size, np.float32)
        a[pick] = 1.0
        a = a.reshape(both.shape)
        b = both.astype(np.float32) - a
        return [self._masked(params, base, reasoning, m, advantages) for m in (a, b)]
