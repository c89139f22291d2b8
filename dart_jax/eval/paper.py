"""The paper's reported numbers (its results tables), for side-by-side tables, and which of them a run matches.

A paper row is comparable only when the setup matches: the same backbone (Qwen2.5-3B base or
instruct for the QA table, Qwen2.5-Coder-7B for SQL) and the same method. Anything else is shown
for orientation, labelled as a different setup, with no deltas.
"""

from __future__ import annotations

import os

QA_COLUMNS = ("nq", "triviaqa", "popqa", "hotpotqa", "2wiki", "musique", "bamboogle")


def _qa(*vals):
    return dict(zip(QA_COLUMNS + ("Avg",), vals))


# EM, Qwen2.5-3B backbones (the paper's QA results table)
PAPER_QA = {
    ("search_r1", "qwen2.5-3b-base"): _qa(0.440, 0.582, 0.413, 0.265, 0.244, 0.061, 0.113, 0.303),
    ("mixlora", "qwen2.5-3b-base"): _qa(0.427, 0.595, 0.443, 0.292, 0.282, 0.063, 0.176, 0.325),
    ("dart", "qwen2.5-3b-base"): _qa(0.457, 0.605, 0.478, 0.399, 0.389, 0.155, 0.352, 0.405),
    ("search_r1", "qwen2.5-3b-instruct"): _qa(0.397, 0.565, 0.391, 0.331, 0.310, 0.124, 0.232, 0.336),
    ("mixlora", "qwen2.5-3b-instruct"): _qa(0.431, 0.578, 0.419, 0.346, 0.348, 0.125, 0.288, 0.362),
    ("dart", "qwen2.5-3b-instruct"): _qa(0.451, 0.602, 0.476, 0.392, 0.376, 0.143, 0.352, 0.399),
    # averages only (Gen-Avg / MH-Avg / Avg)
    ("dart", "qwen2.5-7b-instruct"): {"Gen-Avg": 0.538, "MH-Avg": 0.330, "Avg": 0.420},
    ("search_r1", "qwen2.5-7b-instruct"): {"Gen-Avg": 0.493, "MH-Avg": 0.324, "Avg": 0.396},
    ("dart", "qwen2.5-7b-base"): {"Gen-Avg": 0.539, "MH-Avg": 0.323, "Avg": 0.416},
    ("search_r1", "qwen2.5-7b-base"): {"Gen-Avg": 0.448, "MH-Avg": 0.277, "Avg": 0.350},
    ("dart", "llama3.1-8b-instruct"): {"Gen-Avg": 0.561, "MH-Avg": 0.392, "Avg": 0.464},
    ("search_r1", "llama3.1-8b-instruct"): {"Gen-Avg": 0.543, "MH-Avg": 0.368, "Avg": 0.443},
    ("dart", "qwen3-14b-base"): {"Avg": 0.497},
    ("search_r1", "qwen3-14b-base"): {"Avg": 0.480},
    # ablation, 3B-Base, average EM
    ("lora16", "qwen2.5-3b-base"): {"Avg": 0.316},
    ("2agent", "qwen2.5-3b-base"): {"Avg": 0.406},
}
for (_, _), _row in PAPER_QA.items():  # the per-dataset rows also carry the group averages
    if "nq" in _row:
        _row["Gen-Avg"] = round(sum(_row[k] for k in QA_COLUMNS[:3]) / 3, 4)
        _row["MH-Avg"] = round(sum(_row[k] for k in QA_COLUMNS[3:]) / 4, 4)

# EX, Qwen2.5-Coder-7B (the paper's NL2SQL results table)
PAPER_SQL = {
    ("dart", "qwen2.5-coder-7b"): {"bird_dev": 0.5215, "spider_dev": 0.8251, "spider_dk": 0.7144,
                                   "spider_realistic": 0.7815, "spider_syn": 0.7137, "spider_test": 0.8291,
                                   "Avg": 0.7309},
    ("2agent", "qwen2.5-coder-7b"): {"Avg": 0.7306},
    ("sky_sql", "qwen2.5-coder-7b"): {"Avg": 0.7156},
    ("lora", "qwen2.5-coder-7b"): {"Avg": 0.7162},
    ("mixlora", "qwen2.5-coder-7b"): {"Avg": 0.6924},
}

METHOD_NAMES = {"dart": "DART", "search_r1": "Search-R1", "mixlora": "MixLoRA", "lora16": "LoRA-16",
                "2agent": "2-Agent", "2agent_lora": "2-Agent-LoRA", "sky_sql": "Sky-SQL", "lora": "LoRA"}
MODEL_KEYS = ("qwen2.5-coder-7b", "qwen2.5-3b", "qwen2.5-7b", "llama3.1-8b", "llama-3.1-8b", "qwen3-14b")


def model_key(model_path: str) -> str | None:
    """The paper backbone a model path names, e.g. '/m/Qwen2.5-3B-Instruct' -> 'qwen2.5-3b-instruct'."""
    name = os.path.basename(os.path.normpath(model_path or "")).lower().replace("_", "-").removeprefix("meta-")
    for key in MODEL_KEYS:
        if name.startswith(key):
            family = key.replace("llama-3.1", "llama3.1")
            if family == "qwen2.5-coder-7b":
                return family
            return f"{family}-{'instruct' if 'instruct' in name else 'base'}"
    return None


def method_key(task: str, variant: str, rank: int | None) -> str:
    """Our method variant -> the paper's method name."""
    if variant == "dart":
        return "dart"
    if variant == "full":
        return "search_r1" if task == "qa" else "sky_sql"
    if variant == "lora":
        return "lora16" if task == "qa" and rank == 16 else "lora"
    return variant


def label(key: tuple[str, str]) -> str:
    method, model = key
    return f"{METHOD_NAMES.get(method, method)} ({model})"


def rows_for(task: str) -> dict:
    return PAPER_QA if task == "qa" else PAPER_SQL


def matching(task: str, method: str | None, model: str | None) -> tuple[str, str] | None:
    """The paper row with the same method and backbone, if any."""
    key = (method, model)
    return key if method and model and key in rows_for(task) else None
