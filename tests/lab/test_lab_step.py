"""One DART GRPO step on lab questions (a tiny random model, SmolLM2's tokenizer, the lexical retriever over
a generated world's corpus): the rows keep their gold chains through the data reader, and the step's
metrics and the held-out check carry the role skills (lab.metrics) beside the reward."""

import json
import math

from configs import quickstart
from dart_jax.data.readers import read_flashrag_jsonl
from dart_jax.lab.questions import make_questions
from dart_jax.lab.world import generate_world
from dart_jax.rl.trainer import Trainer
from dart_jax.run.metrics import read_metrics
from dart_jax.tools.lexical import build_lexical_index

G = 2


def _lab(tmp_path, held_world: int | None = None):
    """Training questions of world 3; held-out ones of world 3 too, or of `held_world` (its corpus in
    tmp_path/held/corpus.jsonl)."""
    world = generate_world(3, "small")
    world.save(str(tmp_path / "world"))
    qs = make_questions(world, 2, hops=(1,), ops=("none", "compare"), seed=0)
    train, held = qs[:2], qs[2:4]
    if held_world is not None:
        other = generate_world(held_world, "small")
        other.save(str(tmp_path / "held"))
        held = make_questions(other, 1, hops=(1,), ops=("none", "compare"), seed=0)
    for name, rows in (("train", train), ("eval", held)):
        (tmp_path / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    index = build_lexical_index(str(tmp_path / "world" / "corpus.jsonl"), str(tmp_path / "index"))
    return train, held, index


def test_the_reader_keeps_the_gold_chain(tmp_path):
    train, _, _ = _lab(tmp_path)
    rows = read_flashrag_jsonl(str(tmp_path / "train.jsonl"), "lab")
    assert [r["lab"] for r in rows] == [q["lab"] for q in train]


def test_one_lab_grpo_step_logs_role_skills(tiny_smollm_dir, tmp_path):
    """...and the held-out check asks another world's questions over that world's corpus (eval.corpus)."""
    train, held, index = _lab(tmp_path, held_world=4)
    c = quickstart.get_config()
    c.model.path = tiny_smollm_dir
    c.warm_start = ""
    c.train.steps, c.train.prompts_per_step, c.train.group_size = 1, 2, G
    c.train.mini_batch, c.train.micro_batch, c.train.shuffle = 2 * G, 1, False
    c.rollout.max_turns, c.rollout.max_tokens_per_turn, c.rollout.max_response_tokens = 1, 24, 160
    c.rollout.max_obs_tokens = 96
    c.retriever.kind, c.retriever.index_dir, c.retriever.corpus = "lexical", index, str(tmp_path / "world/corpus.jsonl")
    c.data.train = [dict(reader="flashrag", path=str(tmp_path / "train.jsonl"), data_source="lab")]
    c.eval.data, c.eval.n, c.eval.every = [dict(reader="flashrag", path=str(tmp_path / "eval.jsonl"),
                                                data_source="lab")], 2, 1
    c.output.dir = str(tmp_path / "run")
    c.output.progress = c.output.tensorboard = c.output.export_adapters = False
    c.mesh.shape = (1, 1, 1)
    c.eval.corpus = str(tmp_path / "held" / "corpus.jsonl")
    trainer = Trainer(c)
    # the same lookup, by an entity name of each world, through the training tool and the held-out one
    name_train, name_held = train[0]["lab"]["titles"][0], held[0]["lab"]["titles"][0]
    for tool, name, other in ((trainer.agent.tool, name_train, name_held), (trainer.eval_tool, name_held, name_train)):
        found = tool([name, other], [{}, {}])
        assert f'(Title: "{name}")' in found[0] or f"(Title: {name})" in found[0], found[0]
        assert name not in found[1], found[1]  # the other world's entity is not in this corpus
    rows = read_metrics(trainer.run()["metrics"])
    step = next(r for r in rows if "reward/mean" in r)
    # a random model: the rates are whatever it did, but they are measured (or NaN-free absent) and in range
    assert step["lab/trajectories"] == 2 * G
    for k in ("lab/copy_rate", "lab/tool_skill", "lab/chain_coverage", "lab/accuracy"):
        if k in step:
            assert 0.0 <= step[k] <= 1.0 and not math.isnan(step[k]), (k, step[k])
    ev = next(r for r in rows if "eval/answer_rate" in r)
    assert ev["eval/lab/trajectories"] == 2
