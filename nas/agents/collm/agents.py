"""CoLLM-NAS's two LLMs (Navigator, Generator) and the SiLLM ablation, over
any categorical space.

* `navigate` — the stateful Navigator: given its own earlier conversation and
  the newest results, writes a strategy (SUMMARY / KEY PATTERNS / DIRECTIONS,
  one direction per decision where the space has few);
* `generate` — the stateless Generator: given the strategy, the space and the
  visited list, writes K candidates, each a JSON array of one value per
  decision in `space.decisions()` order;
* `single` — SiLLM: one call writes a strategy and then the candidates.

Where the endpoint takes GBNF (llama.cpp), replies are constrained: the
strategy to its sections (bounded lengths, so it ends inside max_tokens), the
candidates to exactly K arrays of legal values — a weak model can repeat
itself but never write an illegal architecture. API models get a tolerant
parser that also reads the space's own encodings (`space.decode`).
LLM and parse failures come back in `Answer.errors`, never as exceptions.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, TypeVar

from nas.core.arch import Architecture
from nas.core.space import CategoricalSpace
from nas.errors import EncodingError
from nas.llm.client import Answer, LLMClient, Reply
from nas.llm.gbnf import gbnf_choice, gbnf_literal
from nas.llm.parse import ParseError, snippet

T = TypeVar("T")
Messages = list[dict[str, str]]
CANDIDATES_HEADER = "# CANDIDATES"
MAX_DIRECTIONS = 8    # spaces with more decisions get free direction bullets, not one line per decision

__all__ = ["CANDIDATES_HEADER", "Proposal", "candidates_grammar", "decision_table", "generate", "navigate",
           "parse_candidates", "parse_single", "parse_strategy", "single", "strategy_grammar", "values_text"]


@dataclass(frozen=True)
class Proposal:
    """One candidate as the Generator wrote it: an architecture, or why it is illegal."""

    text: str
    arch: Architecture | None = None
    error: str | None = None


# -- rendering ----------------------------------------------------------------------------------------

def _token(value: Any) -> str:
    return json.dumps(value, default=str)


def values_text(space: CategoricalSpace, arch: Architecture) -> str:
    """An architecture as the Generator writes it: a JSON array in decision order."""
    return "[" + ", ".join(_token(v) for v in space.to_values(arch)) + "]"


def decision_table(space: CategoricalSpace) -> str:
    """One line per run of consecutive decisions with the same choices (OFA's 20 kernel sizes: one line)."""
    decisions, lines, i = space.decisions(), [], 0
    while i < len(decisions):
        j = i
        while j + 1 < len(decisions) and decisions[j + 1].choices == decisions[i].choices:
            j += 1
        choices = ", ".join(_token(c) for c in decisions[i].choices)
        if i == j:
            lines.append(f"- position {i + 1} ({decisions[i].name}): one of {choices}")
        else:
            names = ", ".join(d.name for d in decisions[i:j + 1]) if j - i < MAX_DIRECTIONS \
                else f"{decisions[i].name} .. {decisions[j].name}"
            lines.append(f"- positions {i + 1}-{j + 1} ({names}): each one of {choices}")
        i = j + 1
    return "\n".join(lines)


# -- grammars -----------------------------------------------------------------------------------------

def candidates_grammar(space: CategoricalSpace, k: int, root: str = "root") -> str:
    """GBNF for exactly `k` candidates, one JSON array of legal values per line."""
    rules: dict[tuple[Any, ...], str] = {}
    for d in space.decisions():
        rules.setdefault(d.choices, f"v{len(rules)}")
    cand = ' ", " '.join(rules[d.choices] for d in space.decisions())
    more = f' ("," "\\n" cand){{{k - 1}}}' if k > 1 else ""
    lines = [f'{root} ::= "[\\n" cand{more} "\\n]"',
             f'cand ::= "[" {cand} "]"']
    lines += [f"{name} ::= {gbnf_choice(_token(c) for c in choices)}" for choices, name in rules.items()]
    return "\n".join(lines) + "\n"


def strategy_grammar(space: CategoricalSpace, root: str = "root") -> str:
    """GBNF for the strategy's three sections, bounded so it fits the Navigator's max_tokens."""
    decisions = space.decisions()
    if len(decisions) <= MAX_DIRECTIONS:
        directions = " ".join(f'{gbnf_literal(d.name + ": ")} phrase "\\n"' for d in decisions)
    else:
        directions = 'bullet{1,8}'
    return (f'{root} ::= "# SUMMARY\\n" sentence "\\n# KEY PATTERNS\\n" bullet{{1,3}} '
            f'"# DIRECTIONS\\n" {directions}\n'
            'sentence ::= [^\\n#] [^\\n#]{7,149}\n'
            'bullet ::= "- " [^\\n#] [^\\n#]{3,99} "\\n"\n'
            'phrase ::= [^\\n#] [^\\n#]{1,79}\n')


def single_grammar(space: CategoricalSpace, k: int) -> str:
    """SiLLM: the strategy, then the candidates under a header."""
    return (f'root ::= strategy "{CANDIDATES_HEADER}\\n" candidates\n'
            + strategy_grammar(space, "strategy") + candidates_grammar(space, k, "candidates"))


# -- parsers ------------------------------------------------------------------------------------------

def parse_strategy(text: str, limit: int = 4000) -> str:
    """The strategy text (its content is free; only emptiness is an error), cut at `limit` characters."""
    body = text.split(CANDIDATES_HEADER)[0].strip()
    if not body:
        raise ParseError(f"empty strategy in reply {snippet(text)}")
    return body[:limit]


def _json_values(text: str) -> list[Any]:
    """Every top-level JSON array or object in `text`, in order."""
    decoder, out, i = json.JSONDecoder(), [], 0
    while i < len(text):
        if text[i] in "[{":
            try:
                value, end = decoder.raw_decode(text, i)
            except json.JSONDecodeError:
                i += 1
                continue
            out.append(value)
            i = end
        else:
            i += 1
    return out


def _same(choice: Any, value: Any) -> bool:
    """A written value names a choice: the same JSON, the same number (4 == 4.0), or its text ("3" for 3)."""
    if _token(choice) == _token(value):
        return True
    numbers = all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in (choice, value))
    return (numbers and choice == value) or (isinstance(value, str) and str(choice) == value)


def _match(space: CategoricalSpace, values: list[Any]) -> Architecture:
    decisions = space.decisions()
    if len(values) != len(decisions):
        raise EncodingError(f"{len(values)} values, the space has {len(decisions)} decisions")
    out = []
    for d, v in zip(decisions, values):
        hits = [c for c in d.choices if _same(c, v)]
        if not hits:
            raise EncodingError(f"{d.name}: {_token(v)} is not one of {', '.join(_token(c) for c in d.choices)}")
        out.append(hits[0])
    return space.from_values(out)


def _items(value: Any, n: int) -> list[Any]:
    """Candidates in one JSON value: a list of candidates, one candidate, or a {"candidates": [...]} object."""
    if isinstance(value, dict):
        lists = [v for v in value.values() if isinstance(v, list) and v and isinstance(v[0], (list, dict, str))]
        if len(value) == 1 and lists:
            return list(lists[0])
        return [value]  # a space-native encoding (OFA's {'r': .., 'd': ..})
    if isinstance(value, list) and len(value) == n and not any(isinstance(v, (list, dict)) for v in value):
        return [value]
    return list(value) if isinstance(value, list) else [value]


def parse_candidates(text: str, space: CategoricalSpace) -> list[Proposal]:
    """Every candidate in a reply: value arrays in decision order (tolerant of 4 vs 4.0), else the
    space's own encoding; one that is neither comes back with its one-line error."""
    body = text.split(CANDIDATES_HEADER, 1)[1] if CANDIDATES_HEADER in text else text
    n = len(space.decisions())
    out: list[Proposal] = []
    for value in _json_values(body):
        for item in _items(value, n):
            raw = json.dumps(item, default=str)
            try:
                if isinstance(item, list) and not any(isinstance(v, (list, dict)) for v in item):
                    arch = _match(space, item)
                else:
                    arch = space.decode(item)
            except (EncodingError, ValueError, TypeError, KeyError, IndexError) as err:
                out.append(Proposal(raw, error=str(err).splitlines()[0] if str(err) else type(err).__name__))
                continue
            out.append(Proposal(raw, arch=arch))
    if not out:
        raise ParseError(f"no candidate (a JSON array of {n} values) in reply {snippet(text)}")
    return out


def parse_single(text: str, space: CategoricalSpace) -> tuple[str, list[Proposal]]:
    if CANDIDATES_HEADER not in text:
        raise ParseError(f"no '{CANDIDATES_HEADER}' section in reply {snippet(text)}")
    return parse_strategy(text), parse_candidates(text, space)


# -- calls --------------------------------------------------------------------------------------------

def _ask(client: LLMClient, role: str, messages: Messages, template: str, parse: Callable[[Reply], T], *,
         grammar: str | None, attempt: int, max_tokens: int | None = None) -> Answer[T]:
    """`LLMClient.ask` for a prebuilt conversation (the stateful roles keep their own messages)."""
    answer: Answer[T] = Answer()
    client.attempt(answer, role, messages, parse, template=template, grammar=grammar, attempt=attempt,
                   max_tokens=max_tokens)
    return answer


def navigate(client: LLMClient, space: CategoricalSpace, messages: Messages, template: str, *,
             grammar: bool = True, attempt: int = 0) -> Answer[str]:
    """The Navigator's next strategy; `messages` is its conversation, ending with the new user turn."""
    return _ask(client, "navigator", messages, template, lambda r: parse_strategy(r.text),
                grammar=strategy_grammar(space) if grammar else None, attempt=attempt)


def generate(client: LLMClient, space: CategoricalSpace, messages: Messages, template: str, k: int, *,
             grammar: bool = True, attempt: int = 0) -> Answer[list[Proposal]]:
    """The Generator's candidates (at least one, legal or not; the Coordinator sorts them)."""
    return _ask(client, "generator", messages, template, lambda r: parse_candidates(r.text, space),
                grammar=candidates_grammar(space, k) if grammar else None, attempt=attempt)


def single(client: LLMClient, space: CategoricalSpace, messages: Messages, template: str, k: int, *,
           grammar: bool = True, attempt: int = 0) -> Answer[tuple[str, list[Proposal]]]:
    """SiLLM: strategy and candidates in one call (the budget of both roles' replies)."""
    tokens = client.config.role("navigator").max_tokens + client.config.role("generator").max_tokens
    return _ask(client, "navigator", messages, template, lambda r: parse_single(r.text, space),
                grammar=single_grammar(space, k) if grammar else None, attempt=attempt, max_tokens=tokens)
