"""The lab's world: a few thousand fictional entities (people, organisations, places, works) with typed
attributes and relations, each rendered as a short Wikipedia-like passage, deterministic from a seed.

Names are invented from syllables (no pretrained model knows them); full names are unique and no
name occurs inside another, but name parts are shared (people share first names and surnames, firms
are named after surnames, works share title nouns), and every passage mentions one or two other
entities without giving their facts (distractors). A passage states every attribute and relation of
its entity, relations by the other entity's full name, in varied templates and order. A second
seed is a held-out world: other names, other facts, the same grammar.

    world = generate_world(0)                 # "default": 3,500 entities; "small": 350 (tests)
    world.corpus_rows()                       # Search-R1 rows: {"id", "contents": '"Name"\\ntext'}
    world.save("data/lab/world0"); load_world("data/lab/world0")
"""

from __future__ import annotations

import json
import os
import random
import re
from dataclasses import dataclass, field

from dart_jax.errors import UserError

KINDS = ("person", "org", "place", "work")
PREFIX = {"person": "person", "org": "org", "place": "place", "work": "work"}
SIZES = {"default": {"person": 1800, "org": 600, "place": 300, "work": 800},
         "small": {"person": 180, "org": 60, "place": 30, "work": 80}}

# relation -> the kind it points to, per kind (the question generator walks these)
RELATIONS = {
    "person": {"employer": "org", "birthplace": "place"},
    "org": {"founder": "person", "headquarters": "place"},
    "place": {"mayor": "person"},
    "work": {"author": "person", "publisher": "org"},
}
# attribute -> type: "year" and "count" are ints (compared, subtracted, summed, counted), "str" a short word
ATTRIBUTES = {
    "person": {"born": "year", "awards": "count", "role": "str"},
    "org": {"founded": "year", "employees": "count", "field": "str"},
    "place": {"founded": "year", "population": "count", "region": "str"},
    "work": {"published": "year", "pages": "count", "genre": "str"},
}
ROLES = ("painter", "engineer", "surveyor", "botanist", "composer", "chemist", "architect", "cartographer",
         "weaver", "physician", "sculptor", "astronomer", "historian", "lawyer", "glassblower", "poet")
FIELDS = ("shipbuilding", "glassmaking", "printing", "brewing", "textiles", "mining", "banking", "publishing",
          "clockmaking", "ceramics", "railways", "insurance", "optics", "tanning")
GENRES = ("novel", "memoir", "atlas", "play", "treatise", "songbook", "biography", "chronicle", "almanac",
          "essay")
ORG_SUFFIXES = ("Works", "Press", "Foundry", "Institute", "Company", "Guild", "Mills", "Society", "Bank",
                "Shipyards", "Brothers", "Trust", "Collective", "Workshop")
WORK_NOUNS = ("Lantern", "Garden", "Letters", "Chronicle", "River", "Harvest", "Mirror", "Voyage", "Orchard",
              "Winter", "Tower", "Bridge", "Archive", "Song", "Shore", "Festival", "Ledger", "Compass",
              "Meadow", "Harbour")

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "dr", "kr", "tr", "st",
           "th", "sk", "gr", "vr", "")
_VOWELS = ("a", "e", "i", "o", "u", "a", "e", "o", "ae", "ei", "ou")
_CODAS = ("", "", "", "n", "r", "l", "s", "m", "nd", "rn", "sk", "th", "v", "x")
_ENDINGS = {  # a word's last syllable by use, so names of one kind sound alike and kinds sound apart
    "first": ("a", "o", "ia", "en", "is", "el", "ina", "ar", "et"),
    "last": ("ek", "esh", "ov", "ard", "ane", "ith", "orn", "ulk", "ent", "ass"),
    "place": ("mere", "holt", "var", "dun", "ssa", "wick", "brae", "stad", "lin", "gard"),
    "stem": ("ex", "ol", "ium", "ara", "on", "ica"),
    "adj": ("an", "ine", "ish", "ic", "ese", "ary"),
    "region": ("ia", "and", "ory", "avia"),
}


def _word(rng: random.Random, use: str) -> str:
    n = rng.choice((1, 1, 2))
    w = "".join(rng.choice(_ONSETS) + rng.choice(_VOWELS) + rng.choice(_CODAS) for _ in range(n))
    return (w + rng.choice(_ENDINGS[use])).capitalize()


_AWKWARD = re.compile(r"[aeiou]{3}|aa|ii|uu|[^aeiou]{3}|([^aeioues])\1|^[^aeiou]{2}[^aeiour]")


def _pool(rng: random.Random, use: str, n: int, taken: set[str]) -> list[str]:
    """n distinct invented words of 4..9 letters (easy to say: no three vowels or consonants in a row, no
    doubled consonant), none in `taken` (which grows): pools never share a word."""
    out = []
    while len(out) < n:
        w = _word(rng, use)
        if 4 <= len(w) <= 9 and w.lower() not in taken and not _AWKWARD.search(w.lower()):
            taken.add(w.lower())
            out.append(w)
    return out


@dataclass(frozen=True)
class Entity:
    id: str  # "person-0007", "org-0012", "place-0003", "work-0101" (unique in a world)
    kind: str  # "person" | "org" | "place" | "work"
    name: str  # invented, unique full name; parts may be shared with other names
    attrs: dict  # typed values: years / counts (int), roles / fields / regions / genres (str)
    rels: dict  # relation -> entity id (person.employer -> org id, org.headquarters -> place id, ...)

    def to_json(self) -> dict:
        return {"id": self.id, "kind": self.kind, "name": self.name, "attrs": self.attrs, "rels": self.rels}


@dataclass
class World:
    seed: int
    entities: dict  # id -> Entity, in id order
    passages: dict  # id -> passage text (without the title line)
    size: dict = field(default_factory=dict)
    _names: dict = field(default=None, repr=False, compare=False)

    def by_name(self, name: str) -> Entity | None:
        if self._names is None:
            self._names = {e.name: e for e in self.entities.values()}
        return self._names.get(name)

    def title(self, entity_id: str) -> str:
        return self.entities[entity_id].name

    def corpus_rows(self) -> list[dict]:
        """Search-R1 corpus rows, one per entity, titled with the entity's exact name."""
        return [{"id": f"lab{self.seed}-{i}", "contents": f"\"{e.name}\"\n{self.passages[i]}"}
                for i, e in self.entities.items()]

    def to_json(self) -> dict:
        return {"seed": self.seed, "size": self.size, "entities": [e.to_json() for e in self.entities.values()],
                "passages": self.passages}

    @classmethod
    def from_json(cls, d: dict) -> "World":
        ents = {r["id"]: Entity(r["id"], r["kind"], r["name"], dict(r["attrs"]), dict(r["rels"]))
                for r in d["entities"]}
        return cls(int(d["seed"]), ents, dict(d["passages"]), dict(d.get("size", {})))

    def save(self, out_dir: str) -> dict:
        """Write world.json (entities and facts) and corpus.jsonl (the passages, titled) under out_dir;
        -> {file name: bytes}."""
        os.makedirs(out_dir, exist_ok=True)
        sizes = {}
        path = os.path.join(out_dir, "world.json")
        with open(path, "w", encoding="utf-8") as f:
            json.dump({"seed": self.seed, "size": self.size, "entities": [e.to_json() for e in self.entities.values()]},
                      f, ensure_ascii=False, separators=(",", ":"))
            f.write("\n")
        sizes["world.json"] = os.path.getsize(path)
        path = os.path.join(out_dir, "corpus.jsonl")
        with open(path, "w", encoding="utf-8") as f:
            for r in self.corpus_rows():
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        sizes["corpus.jsonl"] = os.path.getsize(path)
        return sizes


def load_world(path: str) -> World:
    """A saved world: its folder, holding world.json and corpus.jsonl (the passages)."""
    for name in ("world.json", "corpus.jsonl"):
        if not os.path.exists(os.path.join(path, name)):
            raise UserError(f"{os.path.join(path, name)}: no lab world there; build one with "
                            f"python -m launch.lab_build --out={path}")
    with open(os.path.join(path, "world.json"), encoding="utf-8") as f:
        d = json.load(f)
    prefix = f"lab{d['seed']}-"
    passages = {}
    with open(os.path.join(path, "corpus.jsonl"), encoding="utf-8") as f:
        for line in f:
            r = json.loads(line)
            passages[r["id"][len(prefix):]] = r["contents"].split("\n", 1)[1]
    return World.from_json({**d, "passages": passages})


def _sizes(size) -> dict:
    if isinstance(size, str):
        if size not in SIZES:
            raise UserError(f"lab world size {size!r} is unknown; use one of {sorted(SIZES)} or a dict of counts")
        return dict(SIZES[size])
    out = {k: int(size.get(k, 0)) for k in KINDS}
    bad = sorted(set(size) - set(KINDS))
    if bad or min(out.values()) < 2:
        raise UserError(f"lab world size {size!r}: give each of {list(KINDS)} a count >= 2")
    return out


def _names(rng: random.Random, n: dict) -> dict:
    """kind -> n[kind] unique full names; the word pools are disjoint and sized so that parts repeat."""
    taken: set[str] = set()
    first = _pool(rng, "first", max(8, n["person"] // 7), taken)
    last = _pool(rng, "last", max(8, n["person"] // 3), taken)
    places = _pool(rng, "place", n["place"], taken)
    stems = _pool(rng, "stem", max(4, n["org"] // 4), taken)
    adjs = _pool(rng, "adj", max(6, n["work"] // 4), taken)
    out, used = {}, set()

    def unique(make, k):
        names = []
        while len(names) < k:
            s = make()
            if s not in used:
                used.add(s)
                names.append(s)
        return names
    out["person"] = unique(lambda: f"{rng.choice(first)} {rng.choice(last)}", n["person"])
    out["org"] = unique(lambda: f"{rng.choice(last if rng.random() < 0.6 else stems)} {rng.choice(ORG_SUFFIXES)}",
                        n["org"])
    out["place"] = places
    out["work"] = unique(lambda: f"The {rng.choice(adjs)} {rng.choice(WORK_NOUNS)}", n["work"])
    out["region"] = _pool(rng, "region", 10, taken)
    return out


def generate_world(seed: int, size: str | dict = "default") -> World:
    """The world of `seed`: the same seed and size give the same world, byte for byte (random.Random
    seeded from the seed alone, never hash())."""
    n = _sizes(size)
    rng = random.Random(f"dart_jax.lab.world/{int(seed)}")
    names = _names(rng, n)
    ids = {k: [f"{PREFIX[k]}-{i:04d}" for i in range(n[k])] for k in KINDS}
    attrs: dict = {}
    rels: dict = {}
    for i in ids["person"]:
        attrs[i] = {"born": rng.randint(1850, 1975), "awards": rng.randint(1, 12), "role": rng.choice(ROLES)}
        rels[i] = {"employer": rng.choice(ids["org"]), "birthplace": rng.choice(ids["place"])}
    for i in ids["org"]:
        founder = rng.choice(ids["person"])
        attrs[i] = {"founded": min(2015, attrs[founder]["born"] + rng.randint(22, 50)),
                    "employees": rng.randint(20, 4000), "field": rng.choice(FIELDS)}
        rels[i] = {"founder": founder, "headquarters": rng.choice(ids["place"])}
    for i in ids["place"]:
        attrs[i] = {"founded": rng.randint(1150, 1850), "population": rng.randint(800, 95000),
                    "region": rng.choice(names["region"])}
        rels[i] = {"mayor": rng.choice(ids["person"])}
    for i in ids["work"]:
        author = rng.choice(ids["person"])
        attrs[i] = {"published": min(2020, attrs[author]["born"] + rng.randint(20, 65)),
                    "pages": rng.randint(60, 900), "genre": rng.choice(GENRES)}
        rels[i] = {"author": author, "publisher": rng.choice(ids["org"])}
    entities = {}
    for k in KINDS:
        for i, name in zip(ids[k], names[k]):
            entities[i] = Entity(i, k, name, attrs[i], rels[i])
    passages = _passages(rng, entities)
    return World(int(seed), entities, passages, n)


# --- passages ----------------------------------------------------------------------------------------
# {S}: the subject (full name first, then the name or a short reference); {N}: the full name;
# values by attribute / relation name (relations rendered as the other entity's full name).
_LEADS = {
    "person": [("{N} (born {born}) is a {role}.", ("born", "role")),
               ("{N} is a {role} from {birthplace}.", ("role", "birthplace")),
               ("{N} is a {role} who works for {employer}.", ("role", "employer")),
               ("{N} was born in {born} in {birthplace}.", ("born", "birthplace"))],
    "org": [("{N} is a {field} company founded in {founded}.", ("field", "founded")),
            ("{N} is an organisation based in {headquarters}.", ("headquarters",)),
            ("{N} was founded by {founder} in {founded}.", ("founder", "founded")),
            ("{N} is a {field} firm with {employees} employees.", ("field", "employees"))],
    "place": [("{N} is a town in the {region} region.", ("region",)),
              ("{N} is a town founded in {founded}.", ("founded",)),
              ("{N} is a town of {population} people in the {region} region.", ("population", "region"))],
    "work": [("{N} is a {genre} by {author}.", ("genre", "author")),
             ("{N} is a {genre} first published in {published}.", ("genre", "published")),
             ("{N} is a {genre} of {pages} pages.", ("genre", "pages"))],
}
_FACTS = {
    "born": ["{S} was born in {born}.", "{S} was born in the year {born}.",
             "Records give {born} as the birth year of {S}."],
    "birthplace": ["{S} was born in {birthplace}.", "{S} grew up in {birthplace}, the town of their birth.",
                   "The birthplace of {S} is {birthplace}."],
    "role": ["{S} works as a {role}.", "By profession {S} is a {role}.", "{S} trained as a {role}."],
    "employer": ["{S} works for {employer}.", "{S} is employed by {employer}.", "{S} joined {employer} early on."],
    "awards": ["{S} has received {awards} awards.", "Over a long career {S} won {awards} awards.",
               "{S} holds {awards} awards."],
    "founded": ["{S} was founded in {founded}.", "{S} dates from {founded}.", "{S} was established in {founded}."],
    "employees": ["{S} has {employees} employees.", "{S} employs {employees} people.",
                  "The staff of {S} numbers {employees}."],
    "field": ["{S} works in {field}.", "{S} is known for {field}.", "The main trade of {S} is {field}."],
    "founder": ["{S} was founded by {founder}.", "The founder of {S} is {founder}.", "{founder} set up {S}."],
    "headquarters": ["{S} is based in {headquarters}.", "{S} has its headquarters in {headquarters}.",
                     "The head office of {S} is in {headquarters}."],
    "population": ["{S} has a population of {population}.", "{S} is home to {population} people.",
                   "About {population} people live in {S}."],
    "region": ["{S} lies in the {region} region.", "{S} is part of the {region} region."],
    "mayor": ["The mayor of {S} is {mayor}.", "{S} is governed by its mayor, {mayor}.",
              "{mayor} serves as mayor of {S}."],
    "published": ["{S} was published in {published}.", "{S} first appeared in {published}.",
                  "{S} came out in {published}."],
    "pages": ["{S} has {pages} pages.", "{S} runs to {pages} pages.", "The first edition of {S} had {pages} pages."],
    "genre": ["{S} is a {genre}.", "Critics describe {S} as a {genre}."],
    "author": ["{S} was written by {author}.", "The author of {S} is {author}.", "{author} wrote {S}."],
    "publisher": ["{S} was published by {publisher}.", "The publisher of {S} is {publisher}.",
                  "{publisher} printed {S}."],
}
_DISTRACTORS = ["{S} is not to be confused with {O}.", "{S} is sometimes mentioned alongside {O}.",
                "Some accounts link {S} with {O}.", "{O} is named in a few histories of {S}.",
                "A letter from {O} mentions {S}."]
_SHORT = {"org": ("the company", "the organisation"), "place": ("the town",), "work": ("the work", "the book")}


def _an(word: str) -> str:
    return ("an " if word[0] in "aeiou" else "a ") + word


def _sentence(template: str, values: dict) -> str:
    # "a {role}" -> "an engineer"; then fill; then capitalise the first letter
    template = re.sub(r"\ba \{(role|genre|field)\}", lambda m: "{" + m.group(1) + "_an}", template)
    s = re.sub(r"\b1 awards\b", "1 award", template.format(**values))
    return s[0].upper() + s[1:]


def _passages(rng: random.Random, entities: dict) -> dict:
    parts: dict = {}  # name part -> entity ids sharing it (distractors that look alike)
    for e in entities.values():
        for w in e.name.split():
            if w != "The" and w not in ORG_SUFFIXES and w not in WORK_NOUNS:
                parts.setdefault(w, []).append(e.id)
    ids = list(entities)
    by_kind = {k: [i for i in ids if entities[i].kind == k] for k in KINDS}
    out = {}
    for e in entities.values():
        values = {"N": e.name, **{k: v for k, v in e.attrs.items()}}
        values.update({r: entities[t].name for r, t in e.rels.items()})
        for k in ("role", "genre", "field"):
            if k in values:
                values[k + "_an"] = _an(values[k])
        # one or two distractors: other entities named without their facts, the first a look-alike (one
        # sharing a name part) when there is one, else one of the same kind
        alike = [i for w in e.name.split() for i in parts.get(w, ()) if i != e.id and i not in e.rels.values()]
        others = []
        for d in range(rng.choice((1, 1, 2))):
            o = rng.choice(alike) if alike and d == 0 else rng.choice(by_kind[e.kind] if d == 0 else ids)
            if o != e.id and o not in e.rels.values() and o not in others:
                others.append(o)
        named = [entities[i].name for i in (*others, *e.rels.values())]
        short = list(_SHORT.get(e.kind, ()))
        if e.kind == "person" and not any(e.name.split()[-1] in n.split() for n in named):
            short = [e.name.split()[-1]]  # the surname alone, unless another name in the passage shares it

        def subj() -> str:
            return e.name if not short or rng.random() < 0.5 else rng.choice(short)
        lead, covered = rng.choice(_LEADS[e.kind])
        sentences = [_sentence(lead, values)]
        rest = [k for k in (*e.attrs, *e.rels) if k not in covered]
        rng.shuffle(rest)
        body = [_sentence(rng.choice(_FACTS[k]), {**values, "S": subj()}) for k in rest]
        for o in others:
            body.insert(rng.randint(0, len(body)),
                        _sentence(rng.choice(_DISTRACTORS), {"S": subj(), "O": entities[o].name}))
        out[e.id] = " ".join(sentences + body)
    return out
