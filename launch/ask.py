"""Ask a trained agent questions of your own (or a dataset's) and read each turn: its reasoning, the
tool call, what came back, the answer, and how many tokens each adapter wrote.

    python -m launch.ask --checkpoint=runs/quickstart "Who wrote the novel Dracula?"
    python -m launch.ask --checkpoint=runs/lab_quickstart "Who founded the company that published The Furnish Bridge?"
    python -m launch.ask --checkpoint=runs/quickstart --dataset=nq_corpus_heldout --n=3      # with the gold answers
    python -m launch.ask "Who wrote Hamlet?"          # the embedded SmolLM2 + its shipped QA warm start
    python -m launch.ask --task=sql --db-id=concert_singer "How many singers are there?"

Greedy by default (--temperature for sampling, --seed to repeat a draw); --full shows observations
and reasoning uncut; --json prints the trajectories as JSON lines instead.
"""

from __future__ import annotations

import json

from absl import flags

from launch._cli import Command
from launch._served import define_policy_flags, load_served

CLI = Command("launch.ask", __doc__)
F = CLI.flags
POLICY = define_policy_flags(F)
DATASET = flags.DEFINE_string("dataset", None, "ask this evaluation set's questions (launch.evaluate's names) and "
                              "show their gold answers", flag_values=F)
N = flags.DEFINE_integer("n", 3, "with --dataset: how many questions", flag_values=F)
OFFSET = flags.DEFINE_integer("offset", 0, "with --dataset: the first question", flag_values=F)
DB_ID = flags.DEFINE_string("db-id", None, "NL2SQL: the database the questions are about (under --db-root)",
                            flag_values=F)
TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampling temperature (0: greedy)", flag_values=F)
TOP_P = flags.DEFINE_float("top-p", 1.0, "nucleus sampling (1: off)", flag_values=F)
SEED = flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=F)
FULL = flags.DEFINE_bool("full", False, "observations and reasoning uncut", flag_values=F)
JSON = flags.DEFINE_bool("json", False, "print each trajectory as a JSON line", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    questions = CLI.parse(argv)
    if bool(questions) == bool(DATASET.value):
        raise SystemExit('give the questions ("..." "...") or --dataset=NAME, one of the two')
    if TEMPERATURE.value < 0 or not 0 < TOP_P.value <= 1 or N.value < 1 or OFFSET.value < 0:
        raise SystemExit("--temperature ≥ 0, --top-p in (0, 1], --n ≥ 1, --offset ≥ 0")
    import os

    from dart_jax.serve.engine import Engine, Request
    from dart_jax.serve.render import transcript
    from dart_jax.serve.server import prompt_ids
    served = load_served(POLICY)
    agent, tok = served.agent, served.agent.tok
    tool, asks = None, []
    if DATASET.value:
        from dart_jax.eval.datasets import load_set, resolve
        from dart_jax.eval.job import searched_over, set_corpus_tools
        (s,) = resolve([DATASET.value], served.spec.task)
        rows, _ = load_set(s, OFFSET.value + N.value, served.db_root)
        rows = rows[OFFSET.value:]
        if s.corpus:  # the lab's held-out worlds: searched over their own corpus, as launch.evaluate does
            tool = set_corpus_tools(served.spec, agent.protocol, [s], {s.name: searched_over(s, served.spec)})[s.name]
        for r in rows:
            template = "lab" if r.get("lab") else served.template
            db = r.get("db_path")
            gold = r.get("golden_answers") or ([r["query"]] if r.get("query") else None)
            asks.append((r["question"], template, db, gold))
    else:
        db = None
        if DB_ID.value:
            db = os.path.join(served.db_root or "", DB_ID.value, f"{DB_ID.value}.sqlite")
            if not os.path.isfile(db):
                raise SystemExit(f"--db-id={DB_ID.value}: no {db}")
        elif served.spec.task == "sql":
            raise SystemExit("an NL2SQL agent needs --db-id=NAME (a database under --db-root)")
        asks = [(q, served.template, db, None) for q in questions]
    engine = Engine(agent, served.base, served.adapters, slots=min(len(asks), 16), tool=tool)
    gens = []
    for question, template, db, gold in asks:
        ids = prompt_ids(tok, [{"role": "user", "content": question}], template, db)
        gens.append(engine.submit(Request(tuple(ids), temperature=TEMPERATURE.value, top_p=TOP_P.value,
                                          seed=SEED.value, tools=POLICY["tools"].value,
                                          meta={"db_path": db} if db else {})))
    engine.run_until_idle()
    engine.close()
    for (question, _, _, gold), gen in zip(asks, gens):
        traj = gen.result()
        if JSON.value:
            print(json.dumps({"question": question, "gold": gold,
                              "text": tok.decode(traj["ids"], skip_special_tokens=True), **traj}))
        else:
            print(transcript(tok, agent.protocol, traj, question, FULL.value, gold, served.route_names))
            print()
    return 0


if __name__ == "__main__":
    CLI.run(main)
