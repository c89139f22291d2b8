"""The lab's warm start: LoRA SFT of SmolLM2-135M-Instruct on multi-hop demonstrations over lab world 0.

The lab (dart_jax/lab) is a generated world of invented entities whose questions have two dials:
hops h (1–3 lookups, bridge entities named only in earlier passages) and an operation r (none,
compare, diff, sum, count, bool). Demonstrations follow each question's gold chain with the real
lexical (SQLite FTS5 BM25) retriever over the world's corpus: reasoning that states what is known and
what is missing, a query naming the next entity (never the question), the passage, the values carried
forward, the operation worked out, the answer — several phrasings per step (dart_jax/lab/demos.py).

Only the low end of both dials is taught (h ≤ 2; none / compare / diff; 40 questions per h = 1 cell and
120 per h = 2 cell), on questions made here (question seed 1) minus every question GRPO trains on
(`RL_HOPS` below: h ≥ 2, every operation), so RL has headroom at h = 3 and on sum / count / bool. Two
epochs at lr 1e-3, batches grouped by length. This reproduces the shipped
`data/warm_start/smollm2-135m-lab`:

    python -m launch.sft --config=configs/sft_lab_quickstart.py
    # then copy runs/sft_lab_quickstart/warm_start to data/warm_start/smollm2-135m-lab

Rebuild the shipped worlds (byte for byte) with
`python -m launch.lab_build --seed=0 --out=data/lab/world0 --per-cell=100` (seed 1: world1, held out).
"""

from ml_collections import ConfigDict

from configs import sft_quickstart

WORLD0, WORLD1 = "data/lab/world0", "data/lab/world1"  # training world, held-out world
OPS = ("none", "compare", "diff", "sum", "count", "bool")
SFT_HOPS, SFT_OPS = (1, 2), ("none", "compare", "diff")  # the low end of both dials
RL_HOPS = (2, 3)  # GRPO's difficulty: every operation at two and three hops
SFT_PER_CELL = {1: 40, 2: 120}  # demonstrations made per (h, r) cell


def lab_questions(world: str, hops=RL_HOPS, ops=OPS, **kw) -> dict:
    """A dataset entry: the lab questions of `world` in the cells hops × ops (rows in a seeded order)."""
    return dict(reader="flashrag", path=f"{world}/questions.jsonl", data_source="lab", lab_hops=list(hops),
                lab_ops=list(ops), **kw)


def shared(c: ConfigDict) -> ConfigDict:
    """Model, tool and rollout fields the warm start and the lab's GRPO runs must agree on."""
    c.model.path = "smollm2-135m-instruct"
    c.model.param_dtype = "float32"
    c.model.compute_dtype = "float32"
    c.model.remat_policy = "none"
    c.retriever.kind = "lexical"
    c.retriever.corpus = f"{WORLD0}/corpus.jsonl"
    c.retriever.topk = 1  # entity-name queries find their passage at top-1 (docs/results/lab.md)
    c.rollout.max_turns = 4  # three lookups and one reformulation
    c.rollout.max_tokens_per_turn = 128  # the demonstrations' longest turn: 121 tokens
    c.rollout.max_obs_tokens = 128  # one passage (~70 tokens)
    c.rollout.max_response_tokens = 1536  # three-hop demonstrations: mean 880, p95 1,554 tokens
    c.rollout.invalid_action = "none"
    c.mesh.shape = (1, 1, 1)
    return c


def get_config():
    # the NQ warm start's LoRA (rank 8, alpha 16) and optimiser (lr 3e-4, cosine over the SFT length), with
    # the lab's model, tool and rollout fields and its demonstrations
    c = shared(sft_quickstart.get_config())
    c.sft = ConfigDict(dict(
        # mostly two-hop demonstrations: the bridge hop (a name read from a passage becomes the next
        # query) is what one epoch over an even h1 / h2 mix did not teach (docs/results/lab.md)
        data=[dict(builder="lab", world_seed=0, n=n, hops=[h], ops=list(SFT_OPS), question_seed=1, seed=0)
              for h, n in SFT_PER_CELL.items()],
        # questions GRPO trains on and the held-out world's never become demonstrations
        exclude=[lab_questions(WORLD0), lab_questions(WORLD1, hops=(1, 2, 3))],
        epochs=2, batch_size=8, micro_batch=4, max_length=1280, val_size=32, eval_every=20,
        protocol_check=16, seed=0, export_dtype="float16", train_tag_rows=True,
        group_by_length=True))  # a third less padding than random batches of these demonstrations
    c.optim.lr = 1e-3  # rank-8 LoRA on 135M; 3e-4 over one epoch left the held-out NLL falling at 0.72
    c.output.dir = "runs/sft_lab_quickstart"
    c.output.checkpoint_every = 20
    return c
