"""Evaluate a trained run, a warm start, a base model or PEFT adapters on the paper's evaluation sets
(EM per QA source with Gen-Avg / MH-Avg / Avg, EX per SQL benchmark) through the training sampler and
tools; prints the tables and writes results.{md,csv,json} and per_question.jsonl to --out.

    python -m launch.evaluate --checkpoint=runs/quickstart --limit=50          # as the run was trained
    python -m launch.evaluate --model=smollm2-135m-instruct --task=sql --dataset=spider_dev --limit=50
    python -m launch.evaluate --checkpoint=runs/quickstart --n-samples=50
    python -m launch.evaluate --config=configs/quickstart.py --compose-tool=runs/cea-tool --n-samples=8   # H_Tool

With --checkpoint and no --config, the run is evaluated as it was trained: the base model (and its
dtypes / remat), the task, the method and router, the rollout settings and the tool (retriever URL or
index, corpus, encoder, prefixes, top-k; SQL timeout) come from the run's run_config.json and its
adapters' dart_adapters.json; the sentinel tags come with the adapters' tokenizer. --config (a file in
place of the run's settings), --model, --task and --config.x=y override them, and each value they
change relative to the run is printed (`model.path: run's X → Y (from --model)`). A base model the
adapters were not trained on (another architecture, vocabulary or size, or other weights), or a
retriever URL that does not answer a query, is refused in one line before anything loads.
Without --checkpoint, the defaults are configs/evaluate.py (the embedded SmolLM2, the shipped corpus).
The results header names the model, the retriever (server URL, or index / corpus with its encoder and
prefixes) or databases, the protocol, the samples per question and the temperature.

The lab's sets (lab_world1: the held-out world's h2-3 questions, lab_world1_easy: its h1, lab_world0: the
training world's h2-3) are each searched over their own world's corpus with the run's retriever kind
(lexical for the lab), and report role skills (tool skill, reasoning skill, copy rate, chain coverage,
distinct <think>) pooled and per (hops, op) cell with the degeneracy gate's verdict (--strict-gate:
a flagged set is an error exit):

    python -m launch.evaluate --checkpoint=runs/lab --dataset=lab_world1,lab_world1_easy,lab_world0 --limit=120

--config.rollout.engine=continuous rolls the questions out on the serving engine (serve.rollouts): --batch
rows, a finished row refilled with the next question at once, tool calls off the decode step; each row
draws what it would in its batch, so the records are the batch evaluation's. One policy on one device
(not with --compose-*, a multi-device mesh or several processes).

Run again into the same --out (e.g. after an interruption, or with a larger --limit), an evaluation
reuses the batches already sampled with the same settings and samples only the rest; the records are
the ones a single uninterrupted run writes (dart_jax/eval/resume.py).

Multi-process: the same command on every process with --coordinator / --num-processes / --process-id
(or --distributed, as launch.train); each process samples every N-th batch on its own devices (the
same batches and seeds as one process), process 0 gathers and writes the files.
"""

from __future__ import annotations

import os
import sys
import time

from absl import flags

from launch._cli import Command, config_arg, define_distributed_flags

CLI = Command("launch.evaluate", __doc__, config=True)
F = CLI.flags
START = define_distributed_flags(CLI)
MODEL = flags.DEFINE_string("model", None, "model name or path (overrides config.model.path)", flag_values=F)
TASK = flags.DEFINE_enum("task", None, ["qa", "sql"], "task (default: the config's)", flag_values=F)
CHECKPOINT = flags.DEFINE_string("checkpoint", None, "a run directory, its checkpoints/, or a DART / warm-start "
                                 "adapter directory", flag_values=F)
STEP = flags.DEFINE_integer("step", None, "with an orbax checkpoint directory: this step (default the newest "
                            "usable)", flag_values=F)
PEFT = flags.DEFINE_string("peft", None, "a PEFT LoRA adapter directory applied to every generated token",
                           flag_values=F)
REMOVE = flags.DEFINE_enum("remove-adapter", None, ["reasoning", "tool"], "zero one DART adapter at inference "
                           "(tool: DART-Reas, reasoning: DART-Tool)", flag_values=F)
DATASET = flags.DEFINE_multi_string("dataset", [], "evaluation sets (comma-separated or repeated); default all of "
                                    "the task's that can run here", flag_values=F)
LIMIT = flags.DEFINE_integer("limit", None, "first N questions of each set (≥ 0; 0 or unset: all; the "
                            "paper uses 1,000)", flag_values=F)
N_SAMPLES = flags.DEFINE_integer("n-samples", 1, "samples per question (> 1: per-question accuracy, CEA's input)",
                                 flag_values=F)
TEMPERATURE = flags.DEFINE_float("temperature", None, "sampling temperature (default 0 = greedy; 1 with "
                                 "--n-samples)", flag_values=F)
TOP_P = flags.DEFINE_float("top-p", 1.0, "nucleus sampling (with a temperature)", flag_values=F)
TOP_K = flags.DEFINE_integer("top-k", 0, "top-k sampling (with a temperature; 0 = off)", flag_values=F)
BATCH = flags.DEFINE_integer("batch", 16, "trajectories per rollout batch", flag_values=F)
SEED = flags.DEFINE_integer("seed", 0, "sampling seed", flag_values=F)
DB_ROOT = flags.DEFINE_string("db-root", None, "SQL databases root (DIR/<db_id>/<db_id>.sqlite); BIRD needs it",
                              flag_values=F)
FIXED = flags.DEFINE_string("fixed-retrieval", None, "replay the documents recorded in this trajectory file "
                            "(per_question.jsonl of an evaluation, or a run's rollouts.jsonl)", flag_values=F)
OUT = flags.DEFINE_string("out", None, "output directory (default runs/eval/<model>-<task>-<time>)", flag_values=F)
COMPARE = flags.DEFINE_multi_string("compare", [], "paper rows to print next to ours, 'method,backbone' "
                                    "(default: the matching row, else all)", flag_values=F)
COMPOSE_TOOL = flags.DEFINE_string("compose-tool", None, "two-model composition: this checkpoint's policy writes the "
                                    "tool spans, the main policy (--checkpoint / --peft / base) the rest (CEA's "
                                    "H_Tool)", flag_values=F)
COMPOSE_REASONING = flags.DEFINE_string("compose-reasoning", None, "two-model composition: this checkpoint's policy "
                                        "writes everything outside the tool spans, the main policy the spans (CEA's "
                                        "H_Reas)", flag_values=F)
RESUME = flags.DEFINE_bool("resume", True, "when --out holds an evaluation with the same settings (all but --limit), "
                           "reuse the batches it sampled and sample only the rest (--noresume: all afresh)",
                           flag_values=F)
KEEP_DISTINCT = flags.DEFINE_bool("keep-distinct", True, "Spider EX: run both queries' DISTINCT as written "
                                  "(--nokeep-distinct: delete it from both, test-suite-sql-eval's default)",
                                  flag_values=F)
QUIET = flags.DEFINE_bool("quiet", False, "no progress bar", flag_values=F)
STRICT_GATE = flags.DEFINE_bool("strict-gate", False, "a lab set (lab_world1, ...) whose role skills the degeneracy "
                                "gate flags (questions copied into the search, template <think>) is an error exit "
                                "once the reports are written, not a warning", flag_values=F)


EVAL_CONFIG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "configs", "evaluate.py")


def _set(config, dotted: str, value) -> None:
    *path, leaf = dotted.split(".")
    node = config
    for part in path:
        node = node[part]
    node[leaf] = value


def build_config(argv: list[str]):
    """-> (the config to evaluate, {"run", "records", "overrides"} when it was taken from a trained run,
    else None).

    Precedence: configs/evaluate.py's defaults < the run's saved settings (--checkpoint without
    --config) < --config.x=y < --task / --model. With --config the file replaces the first two."""
    from configs import evaluate as eval_config
    from dart_jax.eval import as_trained
    config_file = config_arg(argv)
    overridden = {n[len("config."):]: F[n].value for n in F if n.startswith("config.") and F[n].present}
    run = as_trained.locate(CHECKPOINT.value) if CHECKPOINT.value else None
    as_run = None
    if run is not None:
        as_run = eval_config.get_config(run.task or TASK.value or "qa")
        as_trained.adopt(as_run, run)
    if config_file is not None:
        config = CLI.config.value
    else:
        config = (as_run.copy_and_resolve_references() if as_run is not None
                  else eval_config.get_config(TASK.value or "qa"))
        for key, value in overridden.items():
            _set(config, key, value)
    if TASK.value:
        config.task = TASK.value
    if MODEL.value:
        config.model.path = MODEL.value
    if run is None:
        return config, None

    def origin(field: str) -> str:
        flag = {"task": TASK, "model.path": MODEL}.get(field)
        if flag is not None and flag.value:
            return f"--{flag.name}"
        return f"--config.{field}" if field in overridden else f"--config={config_file}"

    from dart_jax.parallel.distributed import is_main
    changed = as_trained.differences(as_run, config, origin)
    if is_main():
        for line in changed:
            print(line)
    return config, {"run": run.run_dir or run.manifest_dir, "records": run.records, "overrides": changed}


def check_flags() -> None:
    """The numeric flags' ranges, checked before anything is loaded or written (one line, exit 2)."""
    rules = [(LIMIT, 0, "0 or unset: every question"), (N_SAMPLES, 1, None), (BATCH, 1, None),
             (STEP, 0, None), (TOP_K, 0, "0: off"), (TEMPERATURE, 0, "0: greedy")]
    for flag, least, note in rules:
        if flag.value is not None and flag.value < least:
            raise SystemExit(f"--{flag.name}={flag.value}: must be ≥ {least}" + (f" ({note})" if note else ""))
    if not 0 < TOP_P.value <= 1:
        raise SystemExit(f"--top-p={TOP_P.value}: must be in (0, 1] (1: off)")


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    # --config.x=y needs a config to parse against: without --config, the evaluation defaults' fields
    # (build_config starts from the run's settings or the defaults and applies only what was given)
    CLI.parse(argv if config_arg(argv) is not None else [f"--config={EVAL_CONFIG}"] + argv)
    check_flags()
    START()
    config, trained = build_config(argv)
    datasets = [d.strip() for spec in DATASET.value for d in spec.split(",") if d.strip()] or None
    from dart_jax.eval.datasets import EVAL_SETS
    own_corpus = bool(datasets) and all(d in EVAL_SETS and EVAL_SETS[d].corpus for d in datasets)
    # a dead retriever.url: one line now, not after the model loads (sets searched over their own corpus
    # — the lab's — never ask it)
    if config.task == "qa" and not FIXED.value and not own_corpus:
        from dart_jax.errors import UserError
        from dart_jax.run.checks import check_retriever
        check = check_retriever(config)
        if check.failed:
            raise UserError(check.message)
    from dart_jax.eval.job import evaluate
    from dart_jax.eval.report import markdown
    from dart_jax.eval.runner import EvalOptions

    n = N_SAMPLES.value
    temperature = TEMPERATURE.value if TEMPERATURE.value is not None else (1.0 if n > 1 else 0.0)
    options = EvalOptions(n_samples=n, temperature=temperature, top_p=TOP_P.value, top_k=TOP_K.value,
                          batch=BATCH.value, seed=SEED.value, limit=LIMIT.value, db_root=DB_ROOT.value,
                          sql_timeout_s=max(float(config.tool.sql_timeout_s), 30.0), keep_distinct=KEEP_DISTINCT.value,
                          progress=not QUIET.value)
    out = OUT.value or os.path.join("runs", "eval", f"{os.path.basename(os.path.normpath(config.model.path))}-"
                                                    f"{config.task}-{time.strftime('%Y%m%d-%H%M%S')}")
    if COMPOSE_TOOL.value and COMPOSE_REASONING.value:
        raise SystemExit("launch.evaluate: give --compose-tool or --compose-reasoning, not both (the main policy "
                         "writes the other role)")
    compose = (("tool", COMPOSE_TOOL.value) if COMPOSE_TOOL.value else
               ("reasoning", COMPOSE_REASONING.value) if COMPOSE_REASONING.value else None)
    results = evaluate(config, out, datasets, options, checkpoint=CHECKPOINT.value, peft=PEFT.value,
                       remove=REMOVE.value, step=STEP.value, fixed_retrieval=FIXED.value,
                       compare=COMPARE.value or None, compose=compose, resume_run=RESUME.value,
                       as_trained=trained, strict_gate=STRICT_GATE.value)
    from dart_jax.parallel.distributed import is_main
    if is_main():
        print(markdown(results))
        for name, path in results["files"].items():
            print(f"{name}: {path}")
    return 0


if __name__ == "__main__":
    CLI.run(main)
