"""Markdown tables (GitHub-flavoured), the one writer of every table the reports and benchmarks print.

    markdown_table(["a", "b"], [[1, 2.5]], align="lr")  is  | a | b |
                                                            |:---|---:|
                                                            | 1 | 2.5 |

Cells are written with `str()` as they are: the caller formats numbers and escapes a `|` inside a
cell when it can occur (parity.check_report does). An empty cell is written `| |`.
"""

from __future__ import annotations

from typing import Sequence

RULES = {None: "---", "": "---", "-": "---", "l": ":---", "r": "---:", "c": ":---:"}


def markdown_row(cells: Sequence) -> str:
    """One table line: `| a | b |`."""
    return "|" + "|".join(f" {c} " if str(c) else " " for c in map(str, cells)) + "|"


def markdown_table(header: Sequence, rows: Sequence[Sequence], align: str | Sequence | None = None) -> str:
    """Header line, rule line, one line per row (no trailing newline). `align`: None (`---` under
    every column), or one of "l", "r", "c", "" / "-" (default) per column."""
    align = [None] * len(header) if align is None else list(align)
    if len(align) != len(header):
        raise ValueError(f"align {align!r}: one entry per column of {list(header)}")
    bad = [a for a in align if a not in RULES]
    if bad:
        raise ValueError(f"align {bad!r}; expected some of {sorted(k for k in RULES if k)}")
    rule = "|" + "|".join(RULES[a] for a in align) + "|"
    return "\n".join([markdown_row(header), rule, *(markdown_row(r) for r in rows)])
