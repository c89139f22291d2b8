"""Talk to a trained agent in the terminal: each line you type is a question; the agent's reasoning,
tool calls and the results it reads stream in as it works, then its answer.

    python -m launch.chat --checkpoint=runs/quickstart
    python -m launch.chat                      # the embedded SmolLM2 + its shipped QA warm start

Commands: /full (show observations uncut, on / off), /tools (tool loop on / off), /temp 0.7 (sampling
temperature; 0 greedy), /quit. Each question is answered on its own (the agent is single-turn).
"""

from __future__ import annotations

import sys

from absl import flags

from launch._cli import Command
from launch._served import define_policy_flags, load_served

CLI = Command("launch.chat", __doc__)
F = CLI.flags
POLICY = define_policy_flags(F)
TEMPERATURE = flags.DEFINE_float("temperature", 0.0, "sampling temperature (0: greedy)", flag_values=F)
DB_ID = flags.DEFINE_string("db-id", None, "NL2SQL: the database the questions are about", flag_values=F)


def main(argv: list[str] | None = None, lines=None, out=None) -> int:
    CLI.parse(argv)
    import os

    from dart_jax.serve.engine import Engine, Request
    from dart_jax.serve.render import transcript
    from dart_jax.serve.server import TextStream, prompt_ids
    out = out or sys.stdout
    served = load_served(POLICY)
    agent, tok = served.agent, served.agent.tok
    db = os.path.join(served.db_root or "", DB_ID.value, f"{DB_ID.value}.sqlite") if DB_ID.value else None
    if served.spec.task == "sql" and (db is None or not os.path.isfile(db)):
        raise SystemExit("an NL2SQL agent needs --db-id=NAME (a database under --db-root)")
    engine = Engine(agent, served.base, served.adapters, slots=1).start()
    state = {"full": False, "tools": POLICY["tools"].value, "temp": TEMPERATURE.value}
    print(f"{served.name} — ask a question (/full, /tools, /temp T, /quit)", file=out, flush=True)
    lines = lines if lines is not None else _stdin()
    try:
        for line in lines:
            line = line.strip()
            if not line:
                continue
            if line in ("/quit", "/exit"):
                break
            if line in ("/full", "/tools"):
                state[line[1:]] = not state[line[1:]]
                print(f"{line[1:]}: {'on' if state[line[1:]] else 'off'}", file=out, flush=True)
                continue
            if line.startswith("/temp"):
                try:
                    state["temp"] = max(0.0, float(line.split()[1]))
                except (IndexError, ValueError):
                    print("usage: /temp 0.7", file=out, flush=True)
                print(f"temperature {state['temp']}", file=out, flush=True)
                continue
            ids = prompt_ids(tok, [{"role": "user", "content": line}], served.template, db)
            gen = engine.submit(Request(tuple(ids), temperature=state["temp"], tools=state["tools"],
                                        meta={"db_path": db} if db else {}))
            text = TextStream(tok, [])
            for ev in gen.stream():
                if ev["kind"] in ("tokens", "observation"):
                    text.add(ev["ids"])
                    print(text.take(), end="", file=out, flush=True)
            print(text.take(final=True), file=out, flush=True)
            summary = transcript(tok, agent.protocol, gen.result(), None, state["full"], None, served.route_names)
            print(summary.splitlines()[-1] if not state["full"] else summary, file=out, flush=True)
    finally:
        engine.close()
    return 0


def _stdin():
    while True:
        try:
            yield input("> ")
        except EOFError:
            return


if __name__ == "__main__":
    CLI.run(main)
