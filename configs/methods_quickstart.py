"""The paper's methods compared on the embedded default (the paper's baselines and ablations): DART, LoRA-16, full
fine-tuning with Search-R1's settings, MixLoRA and 2-Agent, each trained from the shipped warm start
with the same data, steps and seeds, then evaluated greedily on held-out questions.

    python -m launch.methods --config=configs/methods_quickstart.py                  # every missing stage
    python -m launch.methods --config=configs/methods_quickstart.py --stage=train    # train | eval | archive | report
    python -m launch.train --config=configs/methods_quickstart.py:mixlora,1          # one run alone

Every run is the quickstart (configs/quickstart.py: SmolLM2-135M-Instruct + NQ warm start, 24 GRPO
steps of 4 prompts × 4 samples, the MiniLM retriever over the shipped corpus, 2 CPU cores) with only
the method changed; train.seed = the run's seed drives the data order, the initialisation of new
adapters and the sampler. Methods (`dart_jax.experiments.methods_run.METHODS`):

    dart     two routed rank-8 LoRAs (the quickstart), lr 2e-4
    lora16   one rank-16 LoRA (alpha 32: the same scale), lr 2e-4
    full     full-parameter GRPO, Search-R1's invalid-action message, lr 2e-5 (the quickstart's LoRA
             lr scaled by the paper's full / LoRA ratio 1e-6 / 1e-5, as configs/cea_quickstart.py)
    mixlora  rank-8 attention LoRAs + 2 FFN experts of rank 8, top-2, load-balancing 0.001, lr 2e-4
    2agent   two full models routed by role, lr 2e-5 (full-parameter, as `full`); recomputes attention
             in the backward pass (remat "dots_no_batch", the same math) to fit 23 GiB
    2agent_lora  the two models as two rank-8 LoRAs over the frozen base (the cheap 2-Agent), lr 2e-4

Evaluation: greedy, the first `limit` questions of `nq_corpus_heldout` (NQ rows whose gold passage
is in the shipped corpus, never trained on) and `hotpotqa_corpus` (HotpotQA questions whose
paragraphs are in the corpus). Cost on 2 cores (measured, alone on the host): 26–47 min of training
+ 4–7 min of evaluation per LoRA-sized run, 76 + 6 min for full 2-Agent (full FT, partly shared:
104 + 12) — every run is its own resumable stage.
"""

from ml_collections import ConfigDict

from configs import quickstart
from dart_jax.experiments.methods_run import apply_method

OUT = "runs/methods_quickstart"
ARCHIVE = "docs/results/data/methods_smollm2/archive"  # relative to the repository


def get_config(arg: str | None = None):
    """arg: "" (the comparison: DART, seed 0, as the default run) | METHOD[,SEED] (that run)."""
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    if len(parts) > 2:
        raise ValueError(f"configs/methods_quickstart.py:{arg}: expected METHOD[,SEED]")
    c = quickstart.get_config()
    # lists as comma-separated strings, so the command line can set them (--config.methods.methods=dart,full)
    c.methods = ConfigDict(dict(out=OUT, methods="dart,lora16,full,mixlora,2agent,2agent_lora", seeds="0,1",
                                datasets="nq_corpus_heldout,hotpotqa_corpus", limit=64, batch=16,
                                # finished runs kept small and committed (metrics, evaluations, stage times):
                                # archived runs are not retrained; "" turns it off
                                archive=ARCHIVE,
                                # where the report goes ("" = <out>/report); the committed one:
                                # --config.methods.report=docs/results/data/methods_smollm2/report
                                report=""))
    c.eval.n = 0  # the eval stage is the held-out evaluation
    # every method's rows run their own prompt in the update, as the archived runs did (MixLoRA and 2-Agent
    # cannot share one: run.spec)
    c.train.share_prefix = False
    c.train.micro_batch_padding = "mini_batch"  # as the archived runs did (not the embedded default's "own")
    c.eval.batch = 0
    method = parts[0] if parts else "dart"
    seed = int(parts[1]) if len(parts) > 1 else 0
    return apply_method(c, method, seed)
