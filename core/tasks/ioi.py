"""The indirect-object identification (IOI) task for models with a real tokenizer (Wang et al. 2022).

"When Mary and John went to the store, John gave a drink to" -> " Mary": the indirect object
(IO, Mary) is the name not repeated; the subject (S, John) appears twice (S1, S2). The metric is
the logit difference logit[IO] - logit[S] at the last token (METHODS.md, "Real models").

A spec is resolved once against the model's tokenizer (`ioi_spec(tokenizer, ...)`): it keeps the
names, places and objects the tokenizer makes exactly one token with their leading space, and the
templates whose pieces, tokenized one by one, give exactly the tokens of the whole prompt; it
records their ids and the tokenizer's fingerprint, so `build()` needs no tokenizer and the cache
key pins every token. Half the prompts name IO first ("ABBA": When IO and S ..., S gave ... to),
half S first ("BABA"). Prompts of different templates differ in length: they are padded on the
right with an attention mask, the query is each prompt's last real token, target IO.

Counterfactuals (`IoiCounterfactualSpec`), the corrupted prompt of the same template, place and object:
- "abc": IO, S1 and S2 replaced by three other distinct names (the paper's ABC distribution:
  "When C and D went to the store, E gave a drink to"): no name is repeated, so nothing says which
  name is the answer, and logit[IO] - logit[S] is near 0.
- "swap": S2 replaced by IO ("When Mary and John went to the store, Mary gave a drink to"): the
  answer flips to S, so the logit difference turns negative.
Both keep IO and S as the pair's targets (target IO, corrupted_target S): patching and edges
measure logit[IO] - logit[S] on both runs.

The pattern keys ProbeBatch carries are IOI positions, not an induction probe's: duplicate_pos =
S1 (the first mention of the repeated name) and induction_pos = S1 + 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from numbers import Integral
from typing import Any, ClassVar

import numpy as np
import torch

from core.choices import CORRUPTIONS
from core.errors import HeadLabError
from core.results import JsonResult
from core.tasks.counterfactual import PatchPair, ProbeCounterfactual
from core.tasks.probe_batch import MIN_QUERY_POS, ProbeBatch, check_seed
from core.tasks.tokens import excluded_token_ids, is_byte_tokenizer, pad_id, special_prefix, tokenizer_fingerprint

# The IOI paper's 100 first names (Wang et al. 2022, the `NAMES` list of its dataset code).
NAMES = (
    "Michael Christopher Jessica Matthew Ashley Jennifer Joshua Amanda Daniel David James Robert John Joseph Andrew "
    "Ryan Brandon Jason Justin Sarah William Jonathan Stephanie Brian Nicole Nicholas Anthony Heather Eric Elizabeth "
    "Adam Megan Melissa Kevin Steven Thomas Timothy Christina Kyle Rachel Laura Lauren Amber Brittany Danielle Richard "
    "Kimberly Jeffrey Amy Crystal Michelle Tiffany Jeremy Benjamin Mark Emily Aaron Charles Rebecca Jacob Stephen "
    "Patrick Sean Erin Jamie Kelly Samantha Nathan Sara Dustin Paul Angela Tyler Scott Katherine Andrea Gregory Erica "
    "Mary Travis Lisa Kenneth Bryan Lindsey Kristen Jose Alexander Jesse Katie Lindsay Shannon Vanessa Courtney "
    "Christine Alicia Cody Allison Bradley Samuel"
).split()
PLACES = ("store garden restaurant school hospital office house station park beach library market church river "
          "museum airport").split()
OBJECTS = ("ring drink book bone basketball computer necklace bottle ball letter card flower hat cake pen key snack "
           "gift").split()  # consonant-initial: every template says "a {OBJECT}"
# {A} and {B}: the two names in order; {S}: the subject's second mention. Each slot carries its leading space.
TEMPLATES = (
    "When {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "Then, {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
    "After {A} and {B} went to the {PLACE}, {S} gave a {OBJECT} to",
    "While {A} and {B} were working at the {PLACE}, {S} gave a {OBJECT} to",
    "When {A} and {B} got a {OBJECT} at the {PLACE}, {S} decided to give it to",
    "Friends {A} and {B} went to the {PLACE}. {S} gave a {OBJECT} to",
)
SLOTS = ("A", "B", "S", "PLACE", "OBJECT")
MIN_NAMES = 5  # IO, S and the ABC counterfactual's three others
MIN_TEMPLATES = 3
N_TEMPLATE_CHECKS = 8  # fills per template whose whole-prompt tokens must equal the pieces' tokens
_SLOT = re.compile(r" \{(A|B|S|PLACE|OBJECT)\}")


def template_parts(template: str) -> list[str]:
    """A template as alternating literal text and slot names: 'When', 'A', ' and', 'B', ..., ' to'.

    Literal pieces sit at even indices (the first may be ''), slot names at odd ones; each slot's leading
    space belongs to the slot's word (" Mary" is one token, "Mary" another).
    """
    return _SLOT.split(template)


def one_token_words(tokenizer: Any, words: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The words whose leading-space form (" Mary") the tokenizer makes exactly one token, and those ids."""
    kept, ids = [], []
    excluded = excluded_token_ids(tokenizer)  # an unknown word's <unk> is one token, but not the word
    for word in words:
        encoded = list(tokenizer.encode(" " + word, add_special_tokens=False))
        if len(encoded) == 1 and int(encoded[0]) not in excluded:
            kept.append(word)
            ids.append(int(encoded[0]))
    return tuple(kept), tuple(ids)


def _fill(parts: list[str], values: dict[str, str]) -> str:
    return "".join(piece if i % 2 == 0 else " " + values[piece] for i, piece in enumerate(parts))


def _pieces(tokenizer: Any, parts: list[str]) -> tuple[tuple[int, ...], ...]:
    """Each literal piece's ids, the first with the tokenizer's special prefix (e.g. <bos>)."""
    return tuple(tuple(int(i) for i in tokenizer.encode(piece, add_special_tokens=(k == 0)))
                 for k, piece in enumerate(parts[0::2]))


def _template_tokenizes_by_pieces(tokenizer: Any, parts: list[str], pieces: tuple, words: dict[str, tuple]) -> bool:
    """True when the whole prompt's tokens equal the pieces' tokens with one id per slot, on N_TEMPLATE_CHECKS fills."""
    rng = np.random.RandomState(0)
    for _ in range(N_TEMPLATE_CHECKS):
        a, b = rng.choice(len(words["names"][0]), size=2, replace=False)
        place, obj = rng.randint(len(words["places"][0])), rng.randint(len(words["objects"][0]))
        names, ids = words["names"]
        values = {"A": names[a], "B": names[b], "S": names[b], "PLACE": words["places"][0][place],
                  "OBJECT": words["objects"][0][obj]}
        slot_ids = {"A": ids[a], "B": ids[b], "S": ids[b], "PLACE": words["places"][1][place],
                    "OBJECT": words["objects"][1][obj]}
        expected = list(pieces[0])
        for slot, piece in zip(parts[1::2], pieces[1:]):
            expected += [slot_ids[slot], *piece]
        if list(tokenizer.encode(_fill(parts, values), add_special_tokens=True)) != expected:
            return False
    return True


@dataclass(frozen=True)
class IoiSpec(JsonResult):
    """N IOI prompts of one tokenizer, seeded; everything build() reads is here (make it with ioi_spec()).

    names/places/objects: the one-token words and their ids; templates: the template texts kept, and
    template_pieces: per template, its literal pieces' ids (between the slots); pad_id: the right padding's id.
    """

    task: ClassVar[str] = "ioi"
    n_examples: int
    seed: int
    tokenizer: str
    names: tuple[str, ...]
    name_ids: tuple[int, ...]
    places: tuple[str, ...]
    place_ids: tuple[int, ...]
    objects: tuple[str, ...]
    object_ids: tuple[int, ...]
    templates: tuple[str, ...]
    template_pieces: tuple[tuple[tuple[int, ...], ...], ...]
    pad_id: int

    def __post_init__(self) -> None:
        for name in ("n_examples", "seed", "pad_id"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, Integral):
                raise HeadLabError(f"IOI task {name} must be an integer, got {value!r}.")
            object.__setattr__(self, name, int(value))
        check_seed(self.seed, "IOI task seed")
        if self.n_examples < 1:
            raise HeadLabError("IOI task n_examples must be at least 1.")
        for words, ids in (("names", "name_ids"), ("places", "place_ids"), ("objects", "object_ids")):
            object.__setattr__(self, words, tuple(str(w) for w in getattr(self, words)))
            object.__setattr__(self, ids, tuple(int(i) for i in getattr(self, ids)))
            if len(getattr(self, words)) != len(getattr(self, ids)) or not getattr(self, words):
                raise HeadLabError(f"IOI task {words} and {ids} must be non-empty lists of equal length; build it with "
                                   "ioi_spec(tokenizer).")
        if len(self.names) < MIN_NAMES:
            raise HeadLabError(f"the IOI task needs at least {MIN_NAMES} one-token names; this spec has {len(self.names)}.")
        pieces = tuple(tuple(tuple(int(i) for i in piece) for piece in template) for template in self.template_pieces)
        object.__setattr__(self, "templates", tuple(str(t) for t in self.templates))
        object.__setattr__(self, "template_pieces", pieces)
        if not self.templates or len(self.templates) != len(pieces) or any(
                len(p) != len(template_parts(t)[0::2]) for t, p in zip(self.templates, pieces)):
            raise HeadLabError("IOI task templates and template_pieces do not match; build it with ioi_spec(tokenizer).")

    @property
    def seq_len(self) -> int:
        """The longest prompt's token count (shorter prompts are padded to it)."""
        return max(sum(len(p) for p in pieces) + len(pieces) - 1 for pieces in self.template_pieces)

    def check_vocab(self, vocab_size: int) -> None:
        ids = [*self.name_ids, *self.place_ids, *self.object_ids, self.pad_id,
               *(i for pieces in self.template_pieces for piece in pieces for i in piece)]
        if max(ids) >= int(vocab_size):
            raise HeadLabError(f"this IOI spec uses token id {max(ids)}, outside the model's vocabulary of {vocab_size} "
                               "tokens; it was made for another tokenizer: rebuild it with ioi_spec(tokenizer).")

    def to_json(self) -> dict:
        return {"task": self.task, **super().to_json()}

    def draw(self) -> dict[str, np.ndarray]:
        """Per example (numpy RandomState(seed), in this order per example): template, IO-first flag, IO and S
        (distinct name indices), place, object. Each value: [example] int64."""
        rng = np.random.RandomState(self.seed)
        out = {k: np.empty(self.n_examples, dtype=np.int64) for k in ("template", "io_first", "io", "s", "place", "object")}
        for i in range(self.n_examples):
            out["template"][i] = rng.randint(len(self.templates))
            out["io_first"][i] = rng.randint(2)
            out["io"][i], out["s"][i] = rng.choice(len(self.names), size=2, replace=False)
            out["place"][i] = rng.randint(len(self.places))
            out["object"][i] = rng.randint(len(self.objects))
        return out

    def tokens_of(self, draws: dict[str, np.ndarray], a: np.ndarray, b: np.ndarray, s: np.ndarray
                  ) -> tuple[torch.Tensor, torch.Tensor, np.ndarray]:
        """Prompts with name indices a (first name), b (second), s (S2) per example: (tokens [example, pos] right-
        padded, attention mask [example, pos], slot positions [example, 3]: A, B, S)."""
        n, seq_len = self.n_examples, self.seq_len
        tokens = torch.full((n, seq_len), self.pad_id, dtype=torch.long)
        mask = torch.zeros((n, seq_len), dtype=torch.long)
        slots = np.empty((n, 3), dtype=np.int64)
        for i in range(n):
            t = int(draws["template"][i])
            parts = template_parts(self.templates[t])
            ids = {"A": self.name_ids[a[i]], "B": self.name_ids[b[i]], "S": self.name_ids[s[i]],
                   "PLACE": self.place_ids[draws["place"][i]], "OBJECT": self.object_ids[draws["object"][i]]}
            row = list(self.template_pieces[t][0])
            for slot, piece in zip(parts[1::2], self.template_pieces[t][1:]):
                if slot in ("A", "B", "S"):
                    slots[i, "ABS".index(slot)] = len(row)
                row += [ids[slot], *piece]
            tokens[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
        return tokens, mask, slots

    def build(self) -> ProbeBatch:
        """The clean prompts: query = each prompt's last token, target IO; duplicate_pos S1, induction_pos S1 + 1."""
        return self._clean(self.draw())[0]

    def _clean(self, draws: dict[str, np.ndarray]) -> tuple[ProbeBatch, np.ndarray]:
        io, s, io_first = draws["io"], draws["s"], draws["io_first"].astype(bool)
        a, b = np.where(io_first, io, s), np.where(io_first, s, io)
        tokens, mask, slots = self.tokens_of(draws, a, b, s)
        query = mask.sum(dim=1) - 1
        if int(query.min()) < MIN_QUERY_POS:
            raise HeadLabError(f"an IOI prompt is shorter than {MIN_QUERY_POS + 1} tokens; use longer templates.")
        s1 = torch.from_numpy(np.where(io_first, slots[:, 1], slots[:, 0]))
        batch = ProbeBatch(tokens=tokens, query_pos=query, target=torch.tensor(self.name_ids)[torch.from_numpy(io)],
                           induction_pos=s1 + 1, duplicate_pos=s1, spec=self.batch_spec(),
                           attention_mask=None if bool(mask.all()) else mask)
        return batch, slots

    def batch_spec(self) -> dict:
        return {**self.to_json(), "rng": "numpy.RandomState", "target": "IO (the name not repeated)",
                "pattern_positions": "duplicate_pos = S1 (the subject's first mention), induction_pos = S1 + 1"}


@dataclass(frozen=True)
class IoiCounterfactualSpec(ProbeCounterfactual, JsonResult):
    """The IOI prompts and their corrupted twins ("abc" or "swap", module docstring), the clean side exactly
    probe.build(); the ABC names drawn from numpy RandomState(seed)."""

    task: ClassVar[str] = "ioi-counterfactual"
    probe: IoiSpec
    corruption: str = "abc"
    seed: int = 0

    def __post_init__(self) -> None:
        if not isinstance(self.probe, IoiSpec):
            raise HeadLabError("the IOI counterfactual needs an IoiSpec; build one with ioi_spec(tokenizer, ...).")
        if self.corruption not in CORRUPTIONS:
            raise HeadLabError(f"IOI corruption {self.corruption!r} is unknown; use one of {', '.join(CORRUPTIONS)}.")
        object.__setattr__(self, "seed", check_seed(self.seed, "the counterfactual seed"))

    def build(self) -> PatchPair:
        """Clean prompts (target IO) and corrupted ones of the same token length (corrupted_target S)."""
        draws = self.probe.draw()
        clean, _ = self.probe._clean(draws)
        io, s = draws["io"], draws["s"]
        if self.corruption == "swap":
            io_first = draws["io_first"].astype(bool)
            a, b = np.where(io_first, io, s), np.where(io_first, s, io)
            s2 = io
            what = "S2 replaced by IO: the answer flips to S"
        else:
            rng = np.random.RandomState(self.seed)
            others = np.empty((self.n_examples, 3), dtype=np.int64)
            for i in range(self.n_examples):
                pool = np.setdiff1d(np.arange(len(self.probe.names)), [io[i], s[i]])
                others[i] = rng.choice(pool, size=3, replace=False)
            a, b, s2 = others.T
            what = "IO, S1 and S2 replaced by three other distinct names (ABC)"
        corrupted, _, _ = self.probe.tokens_of(draws, a, b, s2)
        s_ids = torch.tensor(self.probe.name_ids)[torch.from_numpy(s)]
        spec = {"task": self.task, "probe": dict(clean.spec), "corruption": self.corruption, "seed": self.seed,
                "corrupted": what, "metric": "logit difference logit[IO] - logit[S] at the last token"}
        return PatchPair(clean, corrupted, s_ids, spec)


def ioi_spec(tokenizer: Any, n_examples: int = 256, seed: int = 42, names: tuple[str, ...] = tuple(NAMES),
             templates: tuple[str, ...] = TEMPLATES) -> IoiSpec:
    """The IOI spec for a model's tokenizer: the one-token words and the templates that tokenize piece by piece
    with no special or unknown token (other than the tokenizer's own prefix, e.g. <bos>).

    HeadLabError when the tokenizer is HeadLab's byte tokenizer (no name is one token), or keeps fewer than
    MIN_NAMES names or MIN_TEMPLATES templates.
    """
    if is_byte_tokenizer(tokenizer):
        raise HeadLabError("the ioi task needs a model with a word-level tokenizer (names of one token, e.g. SmolLM2 or "
                           "Gemma); this model reads bytes: use --task induction or a probe file.")
    words = {"names": one_token_words(tokenizer, tuple(names)), "places": one_token_words(tokenizer, tuple(PLACES)),
             "objects": one_token_words(tokenizer, tuple(OBJECTS))}
    if len(words["names"][0]) < MIN_NAMES or not words["places"][0] or not words["objects"][0]:
        raise HeadLabError(f"the model's tokenizer makes only {len(words['names'][0])} names, {len(words['places'][0])} "
                           f"places and {len(words['objects'][0])} objects one token; the ioi task needs {MIN_NAMES} "
                           "names and one of each; use a probe file.")
    kept, pieces = [], []
    unknown = excluded_token_ids(tokenizer) - set(special_prefix(tokenizer))  # e.g. <unk> for a word it lacks
    for template in templates:
        parts = template_parts(template)
        template_ids = _pieces(tokenizer, parts)
        if unknown.isdisjoint(i for piece in template_ids for i in piece) and _template_tokenizes_by_pieces(
                tokenizer, parts, template_ids, words):
            kept.append(template)
            pieces.append(template_ids)
    if len(kept) < min(MIN_TEMPLATES, len(templates)):
        raise HeadLabError(f"only {len(kept)} of the {len(templates)} IOI templates tokenize word by word with this "
                           f"model's tokenizer; the ioi task needs {MIN_TEMPLATES}: use a probe file.")
    return IoiSpec(n_examples=n_examples, seed=seed, tokenizer=tokenizer_fingerprint(tokenizer),
                   names=words["names"][0], name_ids=words["names"][1], places=words["places"][0],
                   place_ids=words["places"][1], objects=words["objects"][0], object_ids=words["objects"][1],
                   templates=tuple(kept), template_pieces=tuple(pieces), pad_id=pad_id(tokenizer))


def describe_ioi(spec: IoiSpec) -> str:
    """One line: what the spec kept for its tokenizer (printed by the commands)."""
    return (f"ioi task for tokenizer {spec.tokenizer}: {len(spec.names)} one-token names, {len(spec.places)} places, "
            f"{len(spec.objects)} objects, {len(spec.templates)} templates, prompts up to {spec.seq_len} tokens")

