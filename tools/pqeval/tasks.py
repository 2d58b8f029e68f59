"""Long-context tasks generated locally from CC0 text, after RULER's recipes
(Hsieh et al., 2024: "RULER: What's the Real Context Size of Your
Long-Context Language Models?"), with nothing downloaded.

Tasks (RULER's names in brackets):
- niah_single [niah_single_2]: one needle "One of the special magic numbers
  for {key} is: {value}." in an essay haystack; the value is asked for.
- niah_multikey [niah_multikey_1]: four needles with different keys; one is
  asked for, the other three distract.
- niah_multivalue [niah_multivalue]: four needles with the same key; all four
  values are asked for.
- niah_multiquery [niah_multiquery]: four needles, all four keys asked for.
- vt [vt]: a chain of five variable assignments (VAR A = 12345, VAR B = VAR A,
  ...) hidden in noise; all five names are asked for.
- cwe [cwe]: a numbered list of words, ten appearing 30 times and the others
  3 times; the ten most common are asked for.
- fwe [fwe]: coded words drawn from a Zipf distribution (alpha 2); the three
  most frequent are asked for.
- qa [qa_1, with our own documents]: excerpts of addresses as numbered
  documents, with invented facts ("{name} was appointed {role} of the
  {organisation}.") inserted into some of them; one fact is asked for.

Every task comes with the question after the context ("last") or also before
it ("first"). Haystacks are State of the Union addresses (tests/data/sotu,
CC0); the needles' depths, keys and values come from a seeded generator, so
a (task, placement, length, seed) names one prompt exactly.

Scoring is RULER's: "all" is the share of the references found in the
output (case-insensitive substring), "part" is 1 if any is found.

RULER_TASKS are cells of RULER itself, made by its own generator (vendored
in pqeval.ruler), to cross-check the home-made tasks: make_sample makes
them too; they are not in TASKS, the full evaluation's plan.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, List, Sequence

from pqeval.ruler import CELLS

REPO = Path(__file__).resolve().parents[2]
SOTU = REPO / "tests" / "data" / "sotu"

TASKS = ["niah_single", "niah_multikey", "niah_multivalue", "niah_multiquery", "vt", "cwe",
         "fwe", "qa"]
PLACEMENTS = ["last", "first"]
RULER_TASKS = list(CELLS)

# Held out for perplexity: each document is two consecutive addresses of one
# president (33K+ tokens, long enough for a 32K context and its continuation).
PERPLEXITY_DOCUMENTS = [
    ("1845_james_polk_d", "1846_james_polk_d"),
    ("1847_james_polk_d", "1848_james_polk_d"),
    ("1885_grover_cleveland_d", "1886_grover_cleveland_d"),
    ("1894_grover_cleveland_d", "1895_grover_cleveland_d"),
    ("1891_benjamin_harrison_r", "1892_benjamin_harrison_r"),
    ("1898_william_mc_kinley_r", "1900_william_mc_kinley_r"),
    ("1905_theodore_roosevelt_r", "1906_theodore_roosevelt_r"),
    ("1911_william_h_taft_r", "1912_william_h_taft_r"),
]

NOISE = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again."


@dataclass
class Sample:
    task: str
    placement: str
    seed: int
    prompt: str                 # the user's text: instructions, context, question
    answer_prefix: str          # what the answer starts with (appended after the prompt)
    references: List[str]
    metric: str                 # "all" or "part"
    max_new_tokens: int
    depths: List[float] = field(default_factory=list)  # where the needles are (0..1)

    def score(self, output: str) -> float:
        out = output.lower()
        found = [r.lower() in out for r in self.references]
        if self.metric == "all":
            return sum(found) / len(found)
        return float(any(found))


def perplexity_text(index: int) -> str:
    return "\n\n".join((SOTU / f"{name}.txt").read_text(encoding="utf-8")
                       for name in PERPLEXITY_DOCUMENTS[index])


def _haystack_files() -> List[Path]:
    held_out = {name for pair in PERPLEXITY_DOCUMENTS for name in pair}
    return sorted(p for p in SOTU.glob("*.txt") if p.stem not in held_out)


_SENTENCE = re.compile(r"(?<=[.!?])\s+")


class Corpus:
    """The haystack addresses as sentences, and a vocabulary of their words."""

    def __init__(self):
        self.documents = [p.read_text(encoding="utf-8") for p in _haystack_files()]
        self.sentences = [s.strip() for d in self.documents for s in _SENTENCE.split(d)
                          if s.strip()]
        common = {"the", "and", "that", "this", "with", "have", "from", "will", "which", "their",
                  "they", "been", "were", "there", "would", "these", "those", "about", "other"}
        words = sorted({w for w in re.findall(r"\b[a-z]{4,10}\b", " ".join(self.documents))
                        if w not in common})
        self.words = words

    def essay(self, rng: random.Random, sentences: int) -> List[str]:
        """`sentences` consecutive sentences starting at a random place (wrapping)."""
        start = rng.randrange(len(self.sentences))
        return [self.sentences[(start + i) % len(self.sentences)] for i in range(sentences)]


def _key(rng: random.Random, corpus: Corpus, taken: set) -> str:
    while True:
        key = f"{rng.choice(corpus.words)}-{rng.choice(corpus.words)}"
        if key not in taken:
            taken.add(key)
            return key


def _number(rng: random.Random, taken: set) -> str:
    while True:
        value = str(rng.randrange(1_000_000, 10_000_000))
        if value not in taken:
            taken.add(value)
            return value


def _insert(units: List[str], needles: Sequence[str], depths: Sequence[float]) -> List[str]:
    """Puts each needle between units at its depth (0 = first, 1 = last)."""
    out = list(units)
    for needle, depth in sorted(zip(needles, depths), key=lambda x: -x[1]):
        out.insert(round(depth * len(units)), needle)
    return out


def _niah(task: str, rng: random.Random, corpus: Corpus, units: int):
    keys_taken, values_taken = set(), set()
    if task == "niah_single":
        keys = [_key(rng, corpus, keys_taken)]
        values = [[_number(rng, values_taken)]]
    elif task == "niah_multivalue":
        keys = [_key(rng, corpus, keys_taken)]
        values = [[_number(rng, values_taken) for _ in range(4)]]
    else:  # multikey, multiquery: four keys, one value each
        keys = [_key(rng, corpus, keys_taken) for _ in range(4)]
        values = [[_number(rng, values_taken)] for _ in keys]
    needles = [f"One of the special magic numbers for {k} is: {v}."
               for k, vs in zip(keys, values) for v in vs]
    order = list(range(len(needles)))
    rng.shuffle(order)
    needles = [needles[i] for i in order]
    depths = [rng.random() for _ in needles]
    context = " ".join(_insert(corpus.essay(rng, units), needles, depths))
    if task == "niah_multiquery":
        asked = keys
        refs = [v for vs in values for v in vs]
    else:
        asked = [keys[0]]
        refs = values[0]
    names = ", ".join(asked[:-1]) + (", and " if len(asked) > 1 else "") + asked[-1]
    plural = len(refs) > 1
    question = (f"What {'are all the special magic numbers' if plural else 'is the special magic number'} "
                f"for {names} mentioned in the provided text?")
    prefix = (f"The special magic {'numbers' if plural else 'number'} for {names} mentioned in the "
              f"provided text {'are' if plural else 'is'}")
    intro = ("Some special magic numbers are hidden within the following text. Make sure to "
             "memorize it. I will quiz you about the numbers afterwards.")
    return intro, context, question, prefix, refs, "all", 12 * len(refs) + 4, depths


def _vt(rng: random.Random, corpus: Corpus, units: int):
    names: set = set()
    while len(names) < 5:
        names.add("".join(rng.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ") for _ in range(5)))
    chain = sorted(names, key=lambda _: rng.random())
    value = str(rng.randrange(10_000, 100_000))
    needles = [f"VAR {chain[0]} = {value}."] + [f"VAR {b} = VAR {a}."
                                                for a, b in zip(chain, chain[1:])]
    depths = sorted(rng.random() for _ in needles)  # in order: the chain reads forward
    context = " ".join(_insert([NOISE] * units, needles, depths))
    intro = "Memorize and track the chain(s) of variable assignment hidden in the following text."
    question = f"Find all variables that are assigned the value {value} in the text above."
    prefix = (f"Answer: According to the chain(s) of variable assignment in the text above, 5 "
              f"variables are assigned the value {value}, they are:")
    return intro, context, question, prefix, chain, "all", 32, depths


def _cwe(rng: random.Random, corpus: Corpus, units: int):
    words = rng.sample(corpus.words, min(len(corpus.words), 10 + units))
    common, rare = words[:10], words[10:]
    entries = common * 30 + rare * 3
    rng.shuffle(entries)
    context = "\n".join(f"{i + 1}. {w}" for i, w in enumerate(entries))
    intro = ("Below is a numbered list of words. In these words, some appear more often than "
             "others. Memorize the ones that appear most often.")
    question = "What are the 10 most common words in the above list?"
    prefix = "Answer: The top 10 words that appear most often in the list are:"
    return intro, context, question, prefix, common, "all", 64, []


def _fwe(rng: random.Random, corpus: Corpus, units: int):
    vocabulary = sorted({"".join(rng.choice("abcdefghijklmnopqrstuvwxyz")
                                 for _ in range(rng.randrange(4, 7))) for _ in range(400)})
    rng.shuffle(vocabulary)
    weights = [1.0 / (rank + 1) ** 2.0 for rank in range(len(vocabulary))]
    total = sum(weights)
    counts = [max(1, round(units * w / total)) for w in weights]
    entries = [w for w, c in zip(vocabulary, counts) for _ in range(c)]
    rng.shuffle(entries)
    context = " ".join(entries[i] if i % 5 else "...." + " " + entries[i]
                       for i in range(len(entries)))
    intro = ("Read the following coded text and track the frequency of each coded word. Find "
             "the three most frequently appeared coded words.")
    question = ("Do not provide any explanation. Please ignore the dots '....'. What are the "
                "three most frequently appeared words in the above coded text?")
    prefix = "Answer: According to the coded text above, the three most frequently appeared words are:"
    return intro, context, question, prefix, vocabulary[:3], "all", 24, []


_FIRST = ["Amelia", "Bernard", "Clara", "Desmond", "Eleanor", "Felix", "Grace", "Harold",
          "Irene", "Julian", "Katherine", "Leonard", "Miriam", "Nathaniel", "Olivia", "Percival",
          "Rosalind", "Sebastian", "Theodora", "Vincent"]
_LAST = ["Ashworth", "Blackwood", "Carrington", "Dunmore", "Everly", "Fairbanks", "Galloway",
         "Hargrove", "Inglewood", "Jessup", "Kingsley", "Lockhart", "Merriweather", "Northcott",
         "Oakridge", "Pembroke", "Quincy", "Radcliffe", "Stanton", "Thornbury"]
_ROLES = ["chief archivist", "treasurer", "chief engineer", "senior librarian", "harbor master",
          "chief surveyor", "head botanist", "director of research"]
_ORGS = ["Northern Canal Authority", "Federal Weather Bureau", "Coastal Lighthouse Service",
         "National Seed Library", "Prairie Railroad Commission", "Bureau of River Surveys",
         "Mountain Observatory Board", "Office of Postal Routes"]


def _qa(rng: random.Random, corpus: Corpus, units: int):
    documents, used = [], 0
    while used < units:
        size = rng.randrange(12, 30)  # sentences per document
        documents.append(corpus.essay(rng, size))
        used += size
    facts, taken = [], set()
    for _ in range(min(6, len(documents))):
        while True:
            name = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
            role, org = rng.choice(_ROLES), rng.choice(_ORGS)
            if name not in taken and (role, org) not in taken:
                taken |= {name, (role, org)}
                break
        facts.append((name, role, org))
    where = rng.sample(range(len(documents)), len(facts))
    depths = []
    for (name, role, org), d in zip(facts, where):
        sentence = rng.randrange(len(documents[d]) + 1)
        documents[d].insert(sentence, f"{name} was appointed {role} of the {org}.")
        depths.append((d + sentence / (len(documents[d]))) / len(documents))
    context = "\n\n".join(f"Document {i + 1}:\n" + " ".join(doc) for i, doc in enumerate(documents))
    name, role, org = facts[0]
    intro = ("Answer the question based on the given documents. Only give me the answer and do "
             "not output any other words.\n\nThe following are given documents.")
    question = f"Who was appointed {role} of the {org}?"
    return intro, context, question, "Answer:", [name], "part", 16, depths[:1]


_BUILDERS = {"vt": _vt, "cwe": _cwe, "fwe": _fwe, "qa": _qa}


def make_sample(task: str, placement: str, seed: int, tokens: int, corpus: Corpus,
                count_tokens: Callable[[Sample], int]) -> Sample:
    """The longest prompt whose tokens (count_tokens: the sample as the model
    will see it, answer prefix included) and answer fit in `tokens`."""
    if task in RULER_TASKS:
        from pqeval.ruler import cell  # RULER's word lists load only when asked for
        return cell.make_sample(task, placement, seed, tokens, count_tokens)
    if task not in TASKS:
        raise ValueError(f"unknown task {task!r}; expected one of {TASKS + RULER_TASKS}")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; expected one of {PLACEMENTS}")

    def build(units: int) -> Sample:
        rng = random.Random(f"{task}/{placement}/{seed}/{tokens}")
        builder = _BUILDERS.get(task, lambda r, c, u: _niah(task, r, c, u))
        intro, context, question, prefix, refs, metric, max_new, depths = builder(rng, corpus,
                                                                                   units)
        asked_first = f"\nQuestion: {question}\n" if placement == "first" else ""
        prompt = f"{intro}{asked_first}\n{context}\n\nQuestion: {question}"
        return Sample(task, placement, seed, prompt, prefix, refs, metric, max_new, depths)

    def fits(units: int) -> bool:
        s = build(units)
        return count_tokens(s) + s.max_new_tokens <= tokens

    # The largest size that fits: grow geometrically, then bisect.
    if not fits(1):
        raise ValueError(f"{task}: {tokens} tokens cannot hold even the smallest prompt")
    low, high = 1, 8
    while fits(high):
        low, high = high, high * 2
    while high - low > 1:
        mid = (low + high) // 2
        low, high = (mid, high) if fits(mid) else (low, mid)
    return build(low)
