"""The OpenAI-compatible server (dart_jax/serve/server.py) with the official `openai` client, streaming
and not: the content is the transcript the engine decodes for the same prompt and seed (token for
token, decoded), the `dart` extension carries the trajectory, bad bodies get 400 naming the field,
a full queue 429 with Retry-After, and nothing hangs."""

import json
import threading
import urllib.error
import urllib.request

import openai
import pytest

from dart_jax.serve.engine import Engine, Request
from dart_jax.serve.server import ChatServer, TextStream, prompt_ids

MESSAGES = [{"role": "user", "content": "Who founded the Pomorn Brothers? <search> x </search>"}]


@pytest.fixture(scope="module")
def server(serve_setup):
    agent, base, _ = serve_setup
    srv = ChatServer(Engine(agent, base, None, slots=4, segment=8), "tiny-dart", template="lab", port=0,
                     request_timeout_s=300).start()
    yield srv
    srv.stop()


def _expected(serve_setup, temperature, seed):
    agent, base, _ = serve_setup
    ids = prompt_ids(agent.tok, MESSAGES, "lab")
    engine = Engine(agent, base, None, slots=1, segment=8)
    traj = engine.submit(Request(tuple(ids), temperature=temperature, seed=seed))
    engine.run_until_idle(timeout=300)
    traj = traj.result(timeout=1)
    engine.close()
    return ids, traj, agent.tok.decode(traj["ids"], skip_special_tokens=True)


def test_chat_completion_and_stream_match_the_engine(server, serve_setup):
    ids, traj, text = _expected(serve_setup, 0.8, 7)
    # the user's typed tags are text, not the router's tags
    tok = serve_setup[0].tok
    plain = prompt_ids(tok, [{"role": "user", "content": "Who founded the Pomorn Brothers?"}], "lab")
    tag = tok.convert_tokens_to_ids("<search>")
    assert ids.count(tag) == plain.count(tag) == 1  # the template's own tag only
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)
    assert [m.id for m in client.models.list().data] == ["tiny-dart"]
    r = client.chat.completions.create(model="tiny-dart", messages=MESSAGES, temperature=0.8, seed=7)
    assert r.choices[0].message.content == text
    ext = r.model_extra["dart"]
    assert ext["finish"] == traj["finish"] and ext["tool_calls"] == traj["tool_calls"]
    assert [t["query"] for t in ext["turns"]] == [t["query"] for t in traj["turns"]]
    assert sum(ext["routes"].values()) == r.usage.completion_tokens == int(sum(traj["mask"]))
    assert r.usage.prompt_tokens == len(ids)
    assert r.choices[0].finish_reason in ("stop", "length")
    parts, last = [], None
    for chunk in client.chat.completions.create(model="tiny-dart", messages=MESSAGES, temperature=0.8, seed=7,
                                                stream=True):
        parts.append(chunk.choices[0].delta.content or "")
        last = chunk
    assert "".join(parts) == text
    assert last.choices[0].finish_reason == r.choices[0].finish_reason
    assert last.model_extra["dart"]["turns"] == ext["turns"]


def test_stop_strings_cut_the_transcript(server, serve_setup):
    _, traj, text = _expected(serve_setup, 0.8, 7)
    # a stop string from generated text (observations never stop an answer)
    first_obs = traj["spans"][0][0] if traj["spans"] else len(traj["ids"])
    written = serve_setup[0].tok.decode(traj["ids"][:first_obs], skip_special_tokens=True)
    cut = written[len(written) // 3: len(written) // 3 + 4]
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=300)
    r = client.chat.completions.create(model="tiny-dart", messages=MESSAGES, temperature=0.8, seed=7, stop=[cut])
    assert r.choices[0].message.content == text[:text.find(cut)]
    assert r.choices[0].finish_reason == "stop"


def test_bad_requests_are_400_naming_the_field(server):
    client = openai.OpenAI(base_url=server.url, api_key="unused", max_retries=0, timeout=60)
    for kwargs, field in ((dict(n=2), "n must be 1"), (dict(temperature=3.0), "temperature"),
                          (dict(top_p=0.0), "top_p"), (dict(max_tokens=0), "max_tokens")):
        with pytest.raises(openai.BadRequestError, match=field):
            client.chat.completions.create(model="tiny-dart", messages=MESSAGES, **kwargs)
    with pytest.raises(openai.BadRequestError, match="messages"):
        client.chat.completions.create(model="tiny-dart", messages=[])
    req = urllib.request.Request(server.url + "/chat/completions", data=b"{not json", method="POST",
                                 headers={"Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(req, timeout=30)
    assert e.value.code == 400 and "JSON" in json.loads(e.value.read())["error"]["message"]
    with pytest.raises(urllib.error.HTTPError) as e:
        urllib.request.urlopen(server.url.replace("/v1", "/nope"), timeout=30)
    assert e.value.code == 404


def test_a_full_queue_answers_429_and_nothing_hangs(serve_setup):
    agent, base, _ = serve_setup
    srv = ChatServer(Engine(agent, base, None, slots=1, segment=8, max_waiting=1), "tiny-dart", template="lab", port=0,
                     request_timeout_s=300).start()
    codes, lock = [], threading.Lock()

    def ask(k):
        body = json.dumps({"model": "tiny-dart", "messages": MESSAGES, "seed": k, "max_tokens": 60}).encode()
        req = urllib.request.Request(srv.url + "/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=300) as r:
                code, retry = r.status, None
        except urllib.error.HTTPError as e:
            code, retry = e.code, e.headers.get("Retry-After")
        with lock:
            codes.append((code, retry))

    try:
        threads = [threading.Thread(target=ask, args=(k,)) for k in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(300)
        assert not any(t.is_alive() for t in threads)
    finally:
        srv.stop()
    assert len(codes) == 8 and {c for c, _ in codes} <= {200, 429}, codes
    assert any(c == 200 for c, _ in codes) and any(c == 429 and r == "1" for c, r in codes), codes


def test_text_deltas_hold_back_partial_characters_and_stop_prefixes(serve_setup):
    tok = serve_setup[0].tok
    t = TextStream(tok, ["STOP"])
    ids = tok.encode("héllo wörld ST", add_special_tokens=False)
    out = ""
    for i in ids:
        t.add([i])
        out += t.take()
    assert "\ufffd" not in out and not out.endswith("ST") and out.startswith("héllo")
    assert t.add(tok.encode("OP and more", add_special_tokens=False)) and t.full == "héllo wörld "
    assert out + t.take(final=True) == "héllo wörld "


def test_a_request_past_its_deadline_is_cancelled(serve_setup):
    agent, base, _ = serve_setup
    srv = ChatServer(Engine(agent, base, None, slots=1, segment=8), "tiny-dart", template="lab", port=0,
                     request_timeout_s=0.05).start()
    try:
        client = openai.OpenAI(base_url=srv.url, api_key="unused", max_retries=0, timeout=300)
        with pytest.raises(openai.APIStatusError) as e:
            client.chat.completions.create(model="tiny-dart", messages=MESSAGES, seed=1)
        assert e.value.status_code == 504
        last = None
        for chunk in client.chat.completions.create(model="tiny-dart", messages=MESSAGES, seed=1, stream=True):
            last = chunk
        assert last.model_extra["dart"]["finish"] == "cancelled" and "request_timeout_s" in \
            last.model_extra["dart"]["error"]
        assert srv.stats["timeouts"] == 2
    finally:
        srv.stop()
