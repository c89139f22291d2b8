"""The lab's GRPO study: the lab quickstart (configs/lab_quickstart.py) run with several seeds, each run
evaluated greedily on the held-out world (lab_world1: hops 2–3, every operation, searched over world 1's
corpus) beside the warm start every run starts from, paired question by question, with the role skills
(tool skill, reasoning skill, chain coverage, copy rate) per run, their spread over seeds, and the
degeneracy gate on every evaluation.

    python -m launch.methods --config=configs/methods_lab.py            # every missing stage, resumable
    python -m launch.methods --config=configs/methods_lab.py --config.methods.seeds=0,1,2,3,4
    python -m launch.methods --config=configs/methods_lab.py --config.methods.methods=dart,lora16

The committed runs (docs/results/lab.md) are archived under docs/results/data/lab/methods/archive and the
report written with --config.methods.report=docs/results/data/lab/methods/report.
"""

from ml_collections import ConfigDict

from configs import lab_quickstart
from dart_jax.experiments.methods_run import METHODS, apply_method

OUT = "runs/methods_lab"
ARCHIVE = "docs/results/data/lab/methods/archive"


def run_arg(arg: str | None) -> tuple[str, int]:
    """"" (the study: DART, seed 0, as the default run) | METHOD[,SEED] (that run) -> (method, seed)."""
    parts = [p.strip() for p in (arg or "").split(",") if p.strip()]
    if len(parts) > 2:
        raise ValueError(f"configs/methods_lab.py:{arg}: expected METHOD[,SEED]")
    return (parts[0] if parts else "dart"), (int(parts[1]) if len(parts) > 1 else 0)


def get_config(arg: str | None = None):
    """arg: see `run_arg`."""
    method, seed = run_arg(arg)
    c = lab_quickstart.get_config()
    c.methods = ConfigDict(dict(out=OUT, methods="dart", seeds="0,1,2", datasets="lab_world1", limit=48, batch=16,
                                archive=ARCHIVE, report="",
                                # every method's rate × 5 (DART: 1e-3, the quickstart's lab_quickstart.LR)
                                lr_scale=lab_quickstart.LR / METHODS["dart"]["lr"]))
    c.eval.n = 0  # the eval stage is the held-out evaluation (the first 48 questions: 4 per (hops, op) cell)
    return apply_method(c, method, seed)
