"""A tiny trained DART run for the tests that load one as a user would (launch.evaluate --checkpoint,
launch.ask / launch.serve / launch.chat): a tiny Qwen2 whose greedy continuation of a chat prompt is
`<search> France</search>` (its attention and MLP outputs are zero, so each position's logits are a
function of its own token), trained for one GRPO step against a real retrieval server on 127.0.0.1
serving a three-passage index."""

import json

import torch
import transformers

from configs import quickstart
from dart_jax.rl.trainer import Trainer
from dart_jax.tokenization.sentinels import add_sentinel_tokens
from dart_jax.tools.retrieval import Retriever, build_index
from dart_jax.tools.retrieval_server import RetrievalServer, ServerLimits

PASSAGES = [
    {"id": "0", "contents": "\"Zanzibar Quartz\"\nZanzibar Quartz is a mineral found only in this test corpus."},
    {"id": "1", "contents": "\"Vellmoor Abbey\"\nVellmoor Abbey is a ruin that exists only in this test corpus."},
    {"id": "2", "contents": "\"Orrin Delacourt\"\nOrrin Delacourt was a painter known only to this test corpus."},
]
QUERY_WORD = " France"


def searching_qwen2(path: str, tokenizer_dir: str) -> str:
    """A tiny Qwen2 whose greedy continuation of a chat prompt (ending in "\\n") is
    `<search> France</search>`, then end of turn; saved with the tokenizer of `tokenizer_dir`
    (SmolLM2's) + the sentinel tags."""
    tok = transformers.AutoTokenizer.from_pretrained(tokenizer_dir)
    add_sentinel_tokens(tok)
    nl, query = tok.encode("\n", add_special_tokens=False), tok.encode(QUERY_WORD, add_special_tokens=False)
    assert len(nl) == 1 and len(query) == 1
    ids = {t: tok.convert_tokens_to_ids(t) for t in ("<search>", "</search>")}
    # token -> state (one-hot hidden direction); state -> the token it predicts (all others: end of turn)
    state = {nl[0]: 1, ids["<search>"]: 2, query[0]: 3}
    successor = {0: tok.eos_token_id, 1: ids["<search>"], 2: query[0], 3: ids["</search>"]}
    hidden = 32
    cfg = transformers.Qwen2Config(vocab_size=len(tok), hidden_size=hidden, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                                   tie_word_embeddings=False, bos_token_id=1, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.eos_token_id, rms_norm_eps=1e-5)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(cfg).to(torch.float32)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith(("o_proj.weight", "down_proj.weight")):
                p.zero_()
            elif "norm" in name:
                p.fill_(1.0)
            else:
                p.copy_(0.2 * torch.randn_like(p))
        embed = torch.zeros(len(tok), hidden)
        embed[:, 0] = 1.0
        head = torch.zeros(len(tok), hidden)
        for token, s in state.items():
            embed[token] = 0.0
            embed[token, s] = 1.0
        for s, token in successor.items():
            head[token, s] = 10.0
        model.model.embed_tokens.weight.copy_(embed)
        model.lm_head.weight.copy_(head)
    model.save_pretrained(path, safe_serialization=True)
    tok.save_pretrained(path)
    return path




def passage_server(root):
    """A RetrievalServer (started) over PASSAGES, indexed under `root`."""
    corpus = root / "corpus.jsonl"
    corpus.write_text("".join(json.dumps(p) + "\n" for p in PASSAGES))
    index = build_index(str(corpus), "all-minilm-l6-v2", str(root / "index"), progress=False)
    return RetrievalServer(Retriever(index), "127.0.0.1", 0, ServerLimits(warm_batch=1)).start()


def train_tiny_run(model_dir: str, url: str, out: str) -> str:
    """One GRPO step of DART on `model_dir` searching `url`; -> the run directory."""
    c = quickstart.get_config()
    c.model.path = model_dir
    c.warm_start = ""
    c.retriever.url = url
    c.retriever.topk = 2
    c.train.steps, c.train.prompts_per_step, c.train.group_size = 1, 2, 2
    c.train.mini_batch, c.train.micro_batch, c.train.old_logp = 4, 2, "recompute"
    c.rollout.max_turns, c.rollout.max_tokens_per_turn = 1, 8
    c.rollout.max_obs_tokens, c.rollout.max_response_tokens = 96, 160
    c.eval.n = 0
    c.output.dir = str(out)
    c.output.progress, c.output.tensorboard, c.output.save_rollouts = False, False, False
    Trainer(c).run()
    return str(out)
