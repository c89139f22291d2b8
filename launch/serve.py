"""Serve a trained agent over an OpenAI-compatible API, with the tool loop server-side and DART's
per-token routing inside every request (dart_jax/serve: a continuous-batching engine over the JAX
sampler). Loopback by default.

    python -m launch.serve --checkpoint=runs/quickstart --port=8001
    python -m launch.serve --checkpoint=runs/quickstart --remove-adapter=tool     # DART-Tool
    python -m launch.serve                      # the embedded SmolLM2 + its shipped QA warm start

Then, with the official client (pip install openai):

    from openai import OpenAI
    client = OpenAI(base_url="http://127.0.0.1:8001/v1", api_key="unused")
    r = client.chat.completions.create(model="dart", messages=[{"role": "user", "content": "Who wrote Hamlet?"}])
    print(r.choices[0].message.content)        # the transcript: reasoning, searches, results, answer
    print(r.model_extra["dart"]["answer"], r.model_extra["dart"]["routes"])

POST /v1/chat/completions (stream=True for server-sent events), GET /v1/models, GET /health. The
response's `dart` field holds the answer, the turns (queries, observations), the finish and the
generated tokens per adapter. docs/serving.md: what each export and endpoint is for.
"""

from __future__ import annotations

from absl import flags

from launch._cli import Command, check_port
from launch._served import define_policy_flags, load_served

CLI = Command("launch.serve", __doc__)
F = CLI.flags
POLICY = define_policy_flags(F)
HOST = flags.DEFINE_string("host", "127.0.0.1", "loopback by default; 0.0.0.0 exposes it", flag_values=F)
PORT = flags.DEFINE_integer("port", 8001, "port", flag_values=F)
MODEL_ID = flags.DEFINE_string("model-id", "dart", "the model name /v1/models lists", flag_values=F)
SLOTS = flags.DEFINE_integer("slots", 16, "requests decoded at once (the engine's rows)", flag_values=F)
SEGMENT = flags.DEFINE_integer("segment", 16, "tokens per decode segment: requests join and leave between "
                               "segments", flag_values=F)
MAX_WAITING = flags.DEFINE_integer("max-waiting", 256, "requests queued beyond the slots; more get 429",
                                   flag_values=F)
TIMEOUT = flags.DEFINE_float("request-timeout", 600.0, "seconds a request may take (then 504)", flag_values=F)
CAPACITY = flags.DEFINE_integer("capacity", 0, "KV slots per row allocated up front (0: grown on demand, each new size "
                                "compiling once; on an accelerator with memory to spare, the longest request's need "
                                "leaves no compile on the hot path)", flag_values=F)
MIN_PREFIX = flags.DEFINE_integer("min-prefix", 32, "prompt prefixes of at least this many tokens shared with a recent "
                                  "prompt (a system prompt, the instructions) are prefilled once and their KV reused "
                                  "(0: off)", flag_values=F)
WARMUP = flags.DEFINE_bool("warmup", True, "compile the common shapes before serving", flag_values=F)


def main(argv: list[str] | None = None) -> int:
    CLI.parse(argv)
    for flag in (SLOTS, SEGMENT, MAX_WAITING):
        if flag.value < 1:
            raise SystemExit(f"--{flag.name}={flag.value}: must be ≥ 1")
    for flag in (CAPACITY, MIN_PREFIX):
        if flag.value < 0:
            raise SystemExit(f"--{flag.name}={flag.value}: must be ≥ 0")
    if TIMEOUT.value <= 0:
        raise SystemExit(f"--request-timeout={TIMEOUT.value}: must be > 0")
    check_port(HOST.value, PORT.value)  # a port in use: one line now, not after the model loads
    from dart_jax.serve.engine import Engine
    from dart_jax.serve.server import ChatServer
    served = load_served(POLICY)
    engine = Engine(served.agent, served.base, served.adapters, slots=SLOTS.value, segment=SEGMENT.value,
                    max_waiting=MAX_WAITING.value, capacity=CAPACITY.value, min_prefix=MIN_PREFIX.value)
    if WARMUP.value:
        print(f"compiling for {SLOTS.value} slots ...", flush=True)
        from dart_jax.serve.server import prompt_ids
        tok = served.agent.tok
        short, long = ("Who wrote it?", "Which " + "very " * 60 + "long question is this?")
        db = None
        if served.template == "sql":
            import glob
            db = next(iter(sorted(glob.glob(f"{served.db_root}/*/*.sqlite"))), None)
        lens = [] if served.template == "sql" and db is None else [
            len(prompt_ids(tok, [{"role": "user", "content": q}], served.template, db)) for q in (short, long)]
        engine.warmup(tuple(lens) or (128,))
    server = ChatServer(engine, MODEL_ID.value, served.template, HOST.value, PORT.value, TIMEOUT.value,
                        served.db_root, served.route_names, default_tools=POLICY["tools"].value)
    try:
        server.serve_forever(on_ready=lambda s: print(f"serving {served.name} as {MODEL_ID.value!r} at {s.url} "
                                                      f"(POST /chat/completions, GET /models, GET /health)",
                                                      flush=True))
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    CLI.run(main)
