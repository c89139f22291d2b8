"""Spider's hardness levels (easy / medium / hard / extra) of a gold SQL query.

Spider's evaluation script (`evaluation.py`: `eval_hardness`, `count_component1`,
`count_component2`, `count_others`) grades a query by counting its parts on the parse of its own
`process_sql.py`. That parser needs the database schema and rejects SQL outside Spider's grammar;
here the same counts are taken on sqlglot's parse (SQLite dialect), with Spider's rules and its
quirks kept, so the levels are those of the test-suite evaluation (checked on all 1,034 Spider dev
queries against the published 248 / 446 / 174 / 166 split):

    component1   WHERE, GROUP BY, ORDER BY, LIMIT present (1 each) + joined tables (tables − 1)
                 + OR connectors + LIKE conditions (FROM / ON, WHERE, HAVING)
    component2   nested queries: a subquery as a condition's value (ON, WHERE, HAVING), or
                 INTERSECT / UNION / EXCEPT (a subquery in FROM is not counted, as in Spider)
    others       1 each for: > 1 "aggregation", > 1 selected column, > 1 WHERE condition,
                 > 1 GROUP BY column. Spider's aggregation count adds the aggregated selected
                 columns, the negated (NOT) WHERE conditions and the HAVING connectors (its
                 `has_agg` reads the first slot of a condition tuple, the `not` flag, and of a
                 connector string), the aggregated GROUP BY columns and the aggregates in ORDER BY
    easy         component1 ≤ 1, others = 0, component2 = 0
    medium       (others ≤ 2, component1 ≤ 1, component2 = 0) or (component1 ≤ 2, others < 2,
                 component2 = 0)
    hard         (others > 2, component1 ≤ 2, component2 = 0) or (2 < component1 ≤ 3, others ≤ 2,
                 component2 = 0) or (component1 ≤ 1, others = 0, component2 ≤ 1)
    extra        the rest

The SQL quickstart's GRPO curriculum (`max_hardness` of a SQL dataset entry) selects by it.
"""

from __future__ import annotations

import functools

import sqlglot
from sqlglot import expressions as exp

LEVELS = ("easy", "medium", "hard", "extra")


class HardnessError(ValueError):
    """The query does not parse as one SQLite SELECT."""


def _own(node: exp.Expression, kind) -> list:
    """Nodes of `kind` under `node` that belong to its own query level (not inside a nested query)."""
    out = []
    stack = [node]
    while stack:
        n = stack.pop()
        for child in n.iter_expressions():
            if isinstance(child, (exp.Subquery, exp.Select, exp.SetOperation)):
                continue
            if isinstance(child, kind):
                out.append(child)
            stack.append(child)
    return out


def _conditions(node: exp.Expression | None) -> list[exp.Expression]:
    """The leaf conditions of an AND / OR tree (Spider's cond_units), parentheses dropped."""
    if node is None:
        return []
    if isinstance(node, (exp.Where, exp.Having)):
        node = node.this
    while isinstance(node, exp.Paren):
        node = node.this
    if isinstance(node, exp.Connector):
        return _conditions(node.left) + _conditions(node.right)
    return [node]


def _nested_value(cond: exp.Expression) -> int:
    """Spider counts a condition's val1 / val2 that is a query (`x IN (SELECT …)`, `x > (SELECT …)`)."""
    if isinstance(cond, exp.Not):
        cond = cond.this
    n = 0
    for child in cond.iter_expressions():
        inner = child
        while isinstance(inner, exp.Paren):
            inner = inner.this
        if isinstance(inner, (exp.Subquery, exp.Select)):
            n += 1
    return n


def _is_agg(e: exp.Expression) -> bool:
    """Spider's select unit is aggregated when it starts with an aggregate (`max(a) - min(a)` does)."""
    while isinstance(e, (exp.Alias, exp.Paren, exp.Binary)) and not isinstance(e, exp.Connector):
        e = e.left if isinstance(e, exp.Binary) else e.this
    return isinstance(e, exp.AggFunc)


def counts(select: exp.Select, set_ops: int = 0) -> tuple[int, int, int]:
    """(component1, component2, others) of one SELECT level, Spider's way."""
    where = select.args.get("where")
    having = select.args.get("having")
    group = select.args.get("group")
    order = select.args.get("order")
    joins = select.args.get("joins") or []
    on_conds = [c for j in joins for c in _conditions(j.args.get("on"))]
    where_conds = _conditions(where)
    having_conds = _conditions(having)
    clauses = [j.args.get("on") for j in joins] + [where, having]
    c1 = sum(x is not None for x in (where, group, order, select.args.get("limit")))
    c1 += len(joins)
    c1 += sum(len(_own(c, exp.Or)) + isinstance(c, exp.Or) for c in clauses if c is not None)
    c1 += sum(isinstance(c.this if isinstance(c, exp.Not) else c, exp.Like)
              for c in on_conds + where_conds + having_conds)
    c2 = set_ops + sum(_nested_value(c) for c in on_conds + where_conds + having_conds)
    aggs = sum(_is_agg(e) for e in select.expressions)
    aggs += sum(isinstance(c, exp.Not) for c in where_conds)  # Spider's has_agg on a cond_unit reads its not flag
    aggs += max(len(having_conds) - 1, 0) + sum(isinstance(c, exp.Not) for c in having_conds)  # and the connectors
    if group is not None:
        aggs += sum(_is_agg(e) for e in group.expressions)
    if order is not None:
        aggs += sum(len(_own(o, exp.AggFunc)) for o in order.expressions)
    others = int(aggs > 1) + int(len(select.expressions) > 1) + int(len(where_conds) > 1)
    others += int(group is not None and len(group.expressions) > 1)
    return c1, c2, others


def level(c1: int, c2: int, others: int) -> str:
    if c1 <= 1 and others == 0 and c2 == 0:
        return "easy"
    if (others <= 2 and c1 <= 1 and c2 == 0) or (c1 <= 2 and others < 2 and c2 == 0):
        return "medium"
    if (others > 2 and c1 <= 2 and c2 == 0) or (2 < c1 <= 3 and others <= 2 and c2 == 0) or \
            (c1 <= 1 and others == 0 and c2 <= 1):
        return "hard"
    return "extra"


@functools.lru_cache(maxsize=65536)
def components(sql: str) -> tuple[int, int, int]:
    """(component1, component2, others) of a SQL query; a set operation counts its left query and one
    nested query (Spider nests the right query under the left)."""
    try:
        tree = sqlglot.parse_one(sql, read="sqlite")
    except sqlglot.errors.ParseError as e:
        raise HardnessError(f"cannot parse SQL {sql!r}: {e}") from None
    set_ops = 0
    while isinstance(tree, exp.SetOperation):
        tree, set_ops = tree.left, 1
    while isinstance(tree, exp.Subquery):
        tree = tree.this
    if not isinstance(tree, exp.Select):
        raise HardnessError(f"not a SELECT query: {sql!r}")
    return counts(tree, set_ops)


def hardness(sql: str) -> str:
    """Spider's hardness level of a SQL query: 'easy' | 'medium' | 'hard' | 'extra'."""
    return level(*components(sql))


def rank(name: str) -> int:
    if name not in LEVELS:
        raise ValueError(f"hardness {name!r}; expected one of {LEVELS}")
    return LEVELS.index(name)
