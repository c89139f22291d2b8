"""A user's path after training: `launch.ask` a trained run a question of their own, `launch.serve`
it to the official `openai` client, `launch.chat` with it — each loading the run as it was trained
(its base, adapters, retriever and rollout settings). The run is tests/trained_run.py's: a tiny Qwen2
that answers every question with `<search> France</search>` against a real retrieval server, one GRPO
step of DART on it."""

import io
import os

import openai

from trained_run import PASSAGES, QUERY_WORD

OURS = {p["contents"].split("\n")[1] for p in PASSAGES}


def test_ask_shows_each_turn_and_the_routes(trained, capsys):
    from launch import ask
    path, server = trained
    before = server.stats["queries"]
    assert ask.main([f"--checkpoint={path}", "Where is Vellmoor Abbey?", "Who was Orrin Delacourt?"]) == 0
    out = capsys.readouterr().out
    assert out.count("Q  ") == 2 and "Q  Where is Vellmoor Abbey?" in out
    assert out.count(f"search  {QUERY_WORD.strip()}") == 2  # the trained run's query, parsed from its own ids
    results = [line for line in out.splitlines() if line.startswith("result  ")]
    assert len(results) == 2 and all(any(p in r for p in OURS) for r in results)  # the run's server, not ours
    assert server.stats["queries"] - before >= 2
    assert out.count("A  ") == 2 and "tool call" in out and "tool " in out and "reasoning " in out
    # --notools: the tool stop is off, nothing is searched
    before = server.stats["queries"]
    assert ask.main([f"--checkpoint={path}", "--notools", "--json", "Where is Vellmoor Abbey?"]) == 0
    assert server.stats["queries"] == before and '"tool_calls": 0' in capsys.readouterr().out


def test_serve_to_the_openai_client_and_chat(trained):
    from dart_jax.serve.engine import Engine
    from dart_jax.serve.server import ChatServer
    from launch import chat, serve
    from launch._served import load_served
    path, _ = trained
    serve.CLI.parse([f"--checkpoint={path}", "--port=0"])
    served = load_served(serve.POLICY)
    assert served.source["variant"] == "dart" and served.template == "search_r1"
    srv = ChatServer(Engine(served.agent, served.base, served.adapters, slots=4), "dart", served.template, port=0,
                     route_names=served.route_names).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
        r = client.chat.completions.create(model="dart", messages=[{"role": "user", "content": "Where is Vellmoor?"}],
                                           temperature=0)
        ext = r.model_extra["dart"]
        assert ext["tool_calls"] == 1 and ext["turns"][0]["query"] == QUERY_WORD.strip()
        assert ext["routes"]["tool"] >= 1 and ext["routes"]["reasoning"] >= 1  # DART routed inside one request
        assert any(p in r.choices[0].message.content for p in OURS)
        streamed = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model="dart", messages=[{"role": "user", "content": "Where is Vellmoor?"}], temperature=0, stream=True))
        assert streamed == r.choices[0].message.content
    finally:
        srv.stop()
    out = io.StringIO()
    assert chat.main([f"--checkpoint={path}"], lines=["Where is Vellmoor Abbey?", "/tools", "Who?", "/quit"],
                     out=out) == 0
    text = out.getvalue()
    assert "tools: off" in text and text.count("finish ") == 2 and any(p in text for p in OURS)
    assert os.path.isdir(path)
