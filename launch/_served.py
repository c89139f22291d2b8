"""What `launch.serve`, `launch.ask` and `launch.chat` share: their policy flags and the agent they
build from them — a trained run as it was trained (its base, warm start, adapters, tool and rollout
settings: dart_jax/eval/as_trained.py), or the embedded SmolLM2 with its task's shipped warm start."""

from __future__ import annotations

import dataclasses
import logging

from absl import flags

log = logging.getLogger(__name__)


def define_policy_flags(F) -> dict:
    return {
        "checkpoint": flags.DEFINE_string("checkpoint", None, "a run directory (launch.train), its adapters/ or "
                                          "checkpoints/, or a DART / warm-start directory; default: the embedded "
                                          "SmolLM2 with its task's shipped warm start", flag_values=F),
        "task": flags.DEFINE_enum("task", None, ["qa", "sql"], "without --checkpoint: qa (default) or sql",
                                  flag_values=F),
        "remove_adapter": flags.DEFINE_enum("remove-adapter", None, ["reasoning", "tool"], "DART-Reas / DART-Tool: "
                                            "that adapter contributes nothing (its tokens run the base)",
                                            flag_values=F),
        "tools": flags.DEFINE_bool("tools", True, "run the tool loop (--notools: the model answers without "
                                   "searching / querying)", flag_values=F),
        "template": flags.DEFINE_enum("template", None, ["raw", "search_r1", "lab", "sql"], "how a question "
                                      "becomes the prompt (default: the run's: lab for a lab run, sql for NL2SQL, "
                                      "else Search-R1's)", flag_values=F),
        "retriever_url": flags.DEFINE_string("retriever-url", None, "QA: search this retrieval server instead of "
                                             "the run's retriever", flag_values=F),
        "db_root": flags.DEFINE_string("db-root", None, "NL2SQL: the folder of <db_id>/<db_id>.sqlite databases "
                                       "(default: the shipped Spider dev ones)", flag_values=F),
        "max_turns": flags.DEFINE_integer("max-turns", None, "tool calls allowed (default: the run's)",
                                          flag_values=F),
    }


@dataclasses.dataclass
class Served:
    agent: object
    base: object
    adapters: object
    template: str
    name: str
    route_names: dict
    db_root: str | None
    source: dict
    spec: object


def load_served(f: dict) -> Served:
    """The agent the policy flags describe (`define_policy_flags`'s dict of flag holders)."""
    from dart_jax.data.paths import DATA, repo_path
    from dart_jax.eval.policy import load_eval_policy
    from dart_jax.rollout.agent import Agent, tool_for
    from dart_jax.rollout.protocol import PROTOCOLS
    from dart_jax.rollout.sampling import SamplingConfig
    from dart_jax.run.policy import run_mesh
    from dart_jax.run.spec import run_spec
    from dart_jax.run.task import make_tool

    checkpoint = f["checkpoint"].value
    config, run = run_config(checkpoint, f["task"].value)
    task = config.task
    if f["retriever_url"].value:
        config.retriever.url = f["retriever_url"].value
    if f["max_turns"].value is not None:
        if f["max_turns"].value < 0:
            raise SystemExit(f"--max-turns={f['max_turns'].value}: must be ≥ 0")
        config.rollout.max_turns = f["max_turns"].value
    spec = run_spec(config)
    protocol = PROTOCOLS[spec.task]
    policy = load_eval_policy(spec, run_mesh(spec), checkpoint, None, f["remove_adapter"].value)
    if f["tools"].value:
        tool = tool_for(protocol, make_tool(spec, protocol))
    else:
        def tool(queries, metas):
            raise RuntimeError("the tools are off (--notools)")
    rollout = dataclasses.replace(spec.rollout, route_mode=policy.route_mode)
    agent = Agent(policy.cfg, policy.tokenizer, protocol, tool, SamplingConfig(top_k=int(spec.sampling.top_k)),
                  rollout, policy.router_convention or spec.router_convention)
    template = f["template"].value or _run_template(task, run)
    route_names = {"role": {0: "reasoning", 1: "tool"}, "shared": {0: "shared"}}.get(policy.route_mode, {})
    db_root = f["db_root"].value or (f"{DATA}/spider/database" if task == "sql" else None)
    name = policy.source.get("checkpoint") or checkpoint or f"{spec.model.path}+{spec.warm_start or 'base'}"
    log.info("serving %s (%s, route mode %s, template %s)", name, policy.source.get("variant"), policy.route_mode,
             template)
    return Served(agent, policy.base, policy.adapters, template, str(name), route_names,
                  repo_path(db_root) if db_root else None, policy.source, spec)


def run_config(checkpoint: str | None, task: str | None = None):
    """-> (the evaluation config of `checkpoint` as it was trained, or of the embedded SmolLM2 with its
    task's shipped warm start; the TrainedRun or None)."""
    from configs import evaluate as eval_config
    from dart_jax.eval import as_trained
    from dart_jax.run.demo import default_warm_start
    run = as_trained.locate(checkpoint) if checkpoint else None
    trained = run.task if run is not None else None
    if trained and task and task != trained:
        raise SystemExit(f"--task={task}: {checkpoint} was trained on {trained}")
    config = eval_config.get_config(trained or task or "qa")
    if run is not None:
        as_trained.adopt(config, run)
    else:
        config.warm_start = default_warm_start(config.model.path, config.task)
    return config, run


def run_spec_of(checkpoint: str):
    from dart_jax.run.spec import run_spec
    return run_spec(run_config(checkpoint)[0])


def _run_template(task: str, run) -> str:
    """The prompt the run trained on: sql for NL2SQL, lab when its training data is the lab's."""
    if task == "sql":
        return "sql"
    train = (((run.saved or {}).get("data") or {}).get("train") or []) if run is not None else []
    return "lab" if any(isinstance(d, dict) and d.get("data_source") == "lab" for d in train) else "search_r1"
