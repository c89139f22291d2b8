"""Every shipped config builds valid trainer sections (the dataclasses validate each field), and
command-line style overrides reach them."""

import dataclasses
import re

import pytest

from configs import (
    base,
    cea,
    cea_lab,
    cea_quickstart,
    grad_angles_quickstart,
    paper_qa,
    paper_sql,
    quickstart,
    quickstart_sql,
)
from dart_jax.errors import UserError
from dart_jax.run.spec import DERIVED, SECTIONS, TOP_LEVEL, RunSpec, run_spec


def _validate(c):
    run_spec(c)
    n = c.train.prompts_per_step * c.train.group_size
    assert n % c.train.mini_batch == 0 and c.train.mini_batch % c.train.micro_batch == 0
    assert c.data.train, "no training data"
    assert c.model.path


SETUPS = ([(paper_qa, f"{m},{k}") for m in paper_qa.METHODS for k in paper_qa.MODELS]
          + [(paper_sql, m) for m in paper_sql.METHODS]
          + [(cea, f"{v},qwen2.5-7b-base,{r}") for r in cea.ROLE_MASK for v in cea.ROLE_MASK[r]]
          + [(cea_quickstart, a) for a in ("reas", "tool", "unified", "hotpotqa,tool")]
          + [(cea_lab, a) for a in ("reas,0", "tool,1", "unified,2")]
          + [(quickstart, None), (quickstart_sql, None)])


@pytest.mark.parametrize("module,arg", SETUPS, ids=[f"{m.__name__}:{a}" for m, a in SETUPS])
def test_config_builds(module, arg):
    c = module.get_config(arg) if arg is not None else module.get_config()
    _validate(c)


def test_paper_hyper_parameters():
    d = paper_qa.get_config("dart,qwen2.5-3b-base")
    assert (d.method.variant, d.method.rank, d.method.alpha, d.optim.lr) == ("dart", 8, 16.0, 1e-5)
    assert (d.loss.kl_coef, d.loss.clip_low, d.loss.dual_clip, d.loss.kl_type) == (0.001, 0.2, 3.0, "k3")
    assert (d.train.steps, d.train.prompts_per_step, d.train.group_size, d.rollout.max_turns) == (100, 256, 16, 4)
    assert d.optim.warmup_steps == 10 and d.sampling.top_p == 1.0
    s = paper_qa.get_config("search_r1,llama3.1-8b-instruct")
    assert s.method.variant == "full" and s.optim.lr == 1e-6 and s.rollout.invalid_action == "search_r1"
    assert cea.get_config("tool,qwen2.5-3b-base").method.role_mask == "tool"
    assert cea.get_config("reas,qwen2.5-3b-base").method.role_mask == "reasoning"
    assert cea.get_config("reas,qwen2.5-3b-base,authors").method.role_mask == "answer"
    with pytest.raises(ValueError, match="role definitions"):
        cea.get_config("reas,qwen2.5-3b-base,mine")
    # launch.cea's form MODEL[,ROLES]: the whole experiment under one directory, one role mask per variant
    whole = cea.get_config("qwen2.5-3b-base,authors")
    assert whole.cea.out == "runs/cea-qwen2.5-3b-base-authors" and whole.cea.roles == "authors"
    assert dict(whole.cea.role_masks) == {"reas": "answer", "tool": "tool", "unified": "both"}
    assert cea.get_config("tool,qwen2.5-3b-base").output.dir == "runs/cea-qwen2.5-3b-base/train/tool"
    q = cea_quickstart.get_config()
    assert (q.method.variant, q.train.steps, q.cea.n_samples, q.cea.limit) == ("full", 12, 8, 64)
    assert q.cea.datasets == ["nq_corpus_heldout"] and q.warm_start == cea_quickstart.WARM_START
    with pytest.raises(ValueError, match="expected"):
        cea_quickstart.get_config("answer")
    with pytest.raises(ValueError, match="expected one of"):
        paper_qa.get_config("dart,gpt-5")


def test_base_defaults_are_reference_defaults():
    c = base.get()
    assert c.loss.agg_mode == "token-mean" and c.loss.micro_mode == "global" and c.loss.entropy_coef == 0.0
    assert (c.optim.weight_decay, c.optim.clip_norm, c.optim.b2) == (0.01, 1.0, 0.999)
    # the paper's turn budget and DART's invalid-action rule, verl's 10-step warmup
    assert (c.rollout.max_tokens_per_turn, c.rollout.max_response_tokens, c.rollout.max_obs_tokens) == (500, 4096, 1024)
    assert c.rollout.invalid_action == "none" and c.optim.warmup_steps == 10


def test_base_agrees_with_the_dataclasses_field_by_field():
    """configs/base.py holds exactly the dataclasses' fields (run/spec.py SECTIONS; the derived ones,
    which the run sets, excepted) at exactly their defaults, of the same types, and nothing else."""
    c = base.get()
    assert set(c) == set(SECTIONS) | set(TOP_LEVEL)
    top = {f.name: f.default for f in dataclasses.fields(RunSpec)}
    for name in TOP_LEVEL:
        assert c[name] == top[name] and type(c[name]) is type(top[name]), name
    for name, cls in SECTIONS.items():
        fields = {f.name: f for f in dataclasses.fields(cls) if f.init and f.name not in DERIVED.get(name, ())}
        assert set(c[name]) == set(fields), (name, set(c[name]) ^ set(fields))
        for key, f in fields.items():
            value = c[name][key]
            want = list(f.default) if f.metadata.get("config") is list else f.default
            assert value == want and type(value) is type(want), (f"{name}.{key}", value, want)
    spec = run_spec(c)  # and they parse back into the dataclasses' own defaults
    for name, cls in SECTIONS.items():
        if name not in ("rollout", "loss", "router", "algo", "data"):
            assert getattr(spec, name) == cls(), name
    assert spec.rollout == dataclasses.replace(SECTIONS["rollout"](), route_mode=spec.method.route_mode)
    assert spec.loss == dataclasses.replace(SECTIONS["loss"](), norm_length=spec.rollout.max_response_tokens)


def test_unknown_settings_fail_naming_the_field():
    c = base.get()
    c.train.stepz = 3
    with pytest.raises(UserError, match=r"unknown setting train\.stepz: config\.train has .*steps"):
        run_spec(c)
    c = base.get()
    c.rollout.route_mode = "role"
    with pytest.raises(UserError, match=r"rollout\.route_mode.*derived"):
        run_spec(c)


# (section.field, a value out of its range): counts that must be ≥ 1 (a run of -3 steps ran nothing and
# wrote a run directory), counts that may be 0 but not negative
OUT_OF_RANGE = [("train.steps", -3), ("train.steps", 0), ("train.prompts_per_step", 0), ("train.group_size", 0),
                ("train.mini_batch", -8), ("train.micro_batch", 0), ("train.ppo_epochs", 0),
                ("output.checkpoint_every", 0), ("output.keep", 0), ("eval.n", -1), ("eval.every", -2),
                ("retriever.topk", 0), ("optim.weight_decay", -0.1)]


@pytest.mark.parametrize("path,value", OUT_OF_RANGE, ids=[f"{p}={v}" for p, v in OUT_OF_RANGE])
def test_settings_out_of_range_fail_naming_the_field_and_value(path, value):
    c = quickstart.get_config()
    section_name, name = path.split(".")
    c[section_name][name] = value
    with pytest.raises(UserError, match=rf"^{re.escape(path)}={re.escape(str(value))} must be ≥ \d"):
        run_spec(c)


@pytest.mark.parametrize("path,value", [("sft.epochs", 0), ("sft.batch_size", -8), ("sft.micro_batch", 0),
                                        ("sft.max_length", 0), ("sft.eval_every", 0), ("sft.val_size", -1),
                                        ("sft.protocol_check", -1)])
def test_sft_settings_out_of_range_fail_naming_the_field_and_value(path, value):
    from configs import sft_quickstart
    c = sft_quickstart.get_config()
    c.sft[path.split(".")[1]] = value
    with pytest.raises(UserError, match=rf"^{re.escape(path)}={re.escape(str(value))} must be ≥ \d"):
        run_spec(c)


@pytest.mark.parametrize("name", ["sft_quickstart", "sft_sql", "sft_sql_quickstart"])
def test_sft_configs_build(name):
    import importlib

    from dart_jax.sft.trainer import BUILDERS
    c = importlib.import_module(f"configs.{name}").get_config()
    assert run_spec(c).sft is not None
    assert c.method.variant == "lora" and c.sft.exclude, "a warm start must name the evaluation sets it avoids"
    assert c.sft.batch_size % c.sft.micro_batch == 0
    assert all(dict(s)["builder"] in BUILDERS for s in c.sft.data)


def test_quickstart_and_its_warm_start_agree():
    """The warm start's demonstrations must look like the quickstart's rollouts: same tool, same
    observation cap, same turn budget; and the quickstart's GRPO prompts are not warm-start prompts."""
    from configs import sft_quickstart
    q, s = quickstart.get_config(), sft_quickstart.get_config()
    for section_, field in (("retriever", "topk"), ("rollout", "max_obs_tokens"), ("rollout", "max_turns"),
                            ("model", "path"), ("retriever", "corpus")):
        assert q[section_][field] == s[section_][field], (section_, field)
    assert q.warm_start and q.data.train[0]["exclude"] == s.sft.exclude
    assert q.data.train[0]["offset"] + q.data.train[0]["limit"] <= s.sft.data[0]["offset"]


def test_sql_quickstart_and_its_warm_start_agree():
    """Same model, tool and turn budget; the warm start and GRPO take different gold-query folds of
    the training databases, and both check progress on the same held-out questions."""
    from configs import sft_sql_quickstart
    q, s = quickstart_sql.get_config(), sft_sql_quickstart.get_config()
    assert q.task == s.task == "sql"
    for section_, field in (("rollout", "max_obs_tokens"), ("rollout", "max_turns"), ("rollout", "max_tokens_per_turn"),
                            ("model", "path"), ("tool", "sql_timeout_s")):
        assert q[section_][field] == s[section_][field], (section_, field)
    assert {d["query_fold"][0] for d in q.data.train} == {1} and {d["query_fold"][0] for d in s.sft.data} == {0}
    assert q.eval.data == s.sft.check_data and q.eval.n == s.sft.protocol_check
    assert q.warm_start == "data/warm_start/smollm2-135m-spider"


def test_paper_sql_needs_its_training_file_and_excludes_every_evaluation_set(tmp_path):
    """configs/paper_sql.py trains on SkyRL-SQL-653 (a required path): no default that trains on the
    evaluation set, a clear error naming what is missing before any model loads, and every shipped
    SQL evaluation set excluded."""
    from dart_jax.data.readers import DataError
    from dart_jax.eval.datasets import SQL_SETS
    from dart_jax.rl.trainer import Trainer
    c = paper_sql.get_config("dart")
    spec = dict(c.data.train[0])
    assert spec["reader"] == "skyrl_sql" and spec["path"] == "data/skyrl_sql/train.parquet"
    assert {e["data_source"] for e in spec["exclude"]} == {s.name for s in SQL_SETS}
    c.model.path = str(tmp_path / "no-model")  # the data check comes first
    c.data.train = [dict(spec, path="")]
    with pytest.raises(DataError, match="has no path"):
        Trainer(c)
    c.data.train = [dict(spec, path=str(tmp_path / "SkyRL-SQL-653" / "train.parquet"))]
    with pytest.raises(FileNotFoundError, match="SkyRL-SQL-653/train.parquet not found; prepare it with: "
                                                "python -m launch.prepare_data sql"):
        Trainer(c)
    qa = paper_qa.get_config("dart,qwen2.5-3b-base")
    assert {e["data_source"] for e in qa.data.train[0]["exclude"]} >= {"nq", "triviaqa", "popqa", "bamboogle"}


def test_grad_angles_quickstart_section():
    from dart_jax.experiments.grad_run import _section
    c = grad_angles_quickstart.get_config()
    g = _section(c)
    assert g.group_size == 16 and set(g.params) == {"full", "adapters"} and set(g.protocols) == {"paper", "authors"}
    assert g.datasets == ["nq_corpus_heldout"] and c.warm_start
    c.grad_angles.params = ["everything"]
    with pytest.raises(ValueError, match="unknown params"):
        _section(c)
