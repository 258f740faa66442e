"""NADER's agents (Yang et al., CVPR 2025) as one LLM call each.

* `propose` — the Proposer ranks candidate ideas for a node of the modification tree;
* `modify` — the Modifier rewrites the block file with an idea (and, on an LIF
  retry, with its previous draft and the verifier's one-line error);
* `reflect_tip` / `reflect_suggestion` — the Reflector turns failed attempts into
  a tip, or a child that scored below its parent into a suggestion (≤ 50 words).

Each is a prompt file (`nas/agents/nader/prompts/nader_*.md`), a tolerant parser and one
`LLMClient.ask`; LLM and parse failures come back in `Answer.errors`, never as
exceptions. Where the endpoint takes GBNF (llama.cpp), replies are constrained:
the Proposer to valid idea numbers, the Modifier to the block-file syntax
(`nas.spaces.nader.dag.grammar`; single-input blocks in its tight layout, which rules
out most structural errors), the Reflector to one tagged sentence of ≤ 50 words.
"""

from __future__ import annotations

import re

from nas.errors import EncodingError
from nas.llm.client import Answer, LLMClient, Reply
from nas.llm.gbnf import gbnf_choice, gbnf_literal
from nas.llm.parse import ParseError, extract_tagged, fences, find_tagged, snippet
from nas.llm.prompts import load_prompt
from nas.spaces.nader.dag.grammar import MAX_EDGES, MAX_NODES, block_grammar, tight_text
from nas.spaces.nader.dag.macro import role_of
from nas.spaces.nader.dag.ops import OPS
from nas.spaces.nader.dag.parse import parse_block_file

MAX_WORDS = 50
MAX_EXPERIENCES = 5
GROW_NODES, GROW_EDGES = 16, 24   # how much larger than its parent a constrained block may grow

__all__ = ["GROW_EDGES", "GROW_NODES", "MAX_EXPERIENCES", "MAX_WORDS", "block_language", "modify",
           "parse_block_reply", "parse_ranking", "parse_short", "propose", "reflect_suggestion", "reflect_tip"]

# -- the block language, rendered from the op registry ---------------------------------------------------

# One short line per op (our wording); signatures and input counts come from the registry.
_WHAT = {
    "Conv2d": "2-D convolution; padding=-1 pads so that stride 1 keeps H and W",
    "Linear": "fully connected layer on the last dimension",
    "AvgPool2d": "average pooling; stride must be given",
    "MaxPool2d": "max pooling; stride must be given",
    "AdaptiveAvgPool2d": "average-pools H and W down to output_size, e.g. (B,C,H,W) -> (B,C,1,1)",
    "AdaptiveMaxPool2d": "max-pools H and W down to output_size",
    "Add": "elementwise sum of its inputs (broadcasting)",
    "Mul": "elementwise product of its inputs (broadcasting), e.g. to gate a feature map",
    "Multiply": "matrix product of its two inputs, taken in edge order",
    "concat": "joins its inputs along dim; all other dims must agree",
    "mean": "average over dim, which is kept with size 1",
    "max": "maximum over dim, which is kept with size 1",
    "sum": "sum over dim, which is kept with size 1",
    "softmax": "softmax over dim",
    "ReLU": "activation",
    "GELU": "activation",
    "Sigmoid": "activation",
    "DropPath": "drops the whole branch per sample while training (stochastic depth)",
    "BN": "batch normalisation over the channel dimension (dim 1)",
    "LN": "layer normalisation over the last dimension: move channels last first, permute(0,2,3,1)",
    "permute": "reorders dimensions, e.g. permute(0,2,3,1) turns (B,C,H,W) into (B,H,W,C)",
    "reshape": "new shape with the same number of elements, one size may be -1, e.g. reshape(B,C,H*W)",
    "repeat": "tiles the tensor, one count per dimension, e.g. repeat(1,C,1,1)",
}

_RULES = """\
A block file has one section per block: a header line ##Name## for the base block
(##Name_stem## for the stem, ##Name_downsample## for the downsampling block), then
node lines "index:Op" or "index:Op(name=value,...)" and edge lines "a->b", either
each node line followed by the edges into that node, or all edges after the nodes.
An edge a->b feeds the output of node a into node b; a node with several inputs takes
them in the order of its edges. Every node lies on a path from input to output.
Node "input" is the block input, shape (B,C,H,W); node "output" is the block output,
shape (B,dim,H,W), and has exactly one incoming edge. (Two-input cells use input1 and
input2 instead of input.) In the base block dim equals C and H, W are kept; the stem
maps the image to dim channels; the downsample block maps C to dim channels and halves
H and W. The graph has no cycles.
Values are integers or expressions of B, C, dim, H, W with + - * / //, e.g. C/4."""


def _signature(op: str) -> str:
    spec = OPS[op]
    if spec.variadic:
        return f"{op}(v1,v2,...)"
    if not spec.params:
        return op
    args = [p.name if p.default is None else f"{p.name}={p.default}" for p in spec.params]
    return f"{op}({', '.join(args)})"


def _inputs(op: str) -> str:
    spec = OPS[op]
    if spec.min_inputs < 2:
        return ""
    return f" [{spec.min_inputs} inputs]" if spec.max_inputs == spec.min_inputs else f" [{spec.min_inputs}+ inputs]"


def block_language(ops: list[str] | None = None) -> str:
    """The language's rules and its op glossary, compact (one line per op; aliases
    and plain activations folded)."""
    lines, seen, plain = [_RULES, "Operations (arguments with a default may be left out):"], set(), []
    for op in ops or list(OPS):
        spec = OPS.get(op)
        if spec is None or type(spec) in seen:
            continue  # unknown here, or an alias (Concat = concat)
        seen.add(type(spec))
        what = _WHAT.get(op, "")
        if what == "activation":
            plain.append(op)
            continue
        lines.append(f"- {_signature(op)}{_inputs(op)}" + (f": {what}" if what else ""))
    if plain:
        lines.append(f"- {', '.join(plain)}: activations")
    return "\n".join(lines)


# -- parsers ----------------------------------------------------------------------------------------------

def parse_ranking(text: str, n: int, k: int) -> list[int]:
    """Idea numbers (1..n) in a reply, as 0-based indices, deduplicated, at most k.

    Reads a ``<response>`` tag if there is one, else the first line with a number."""
    inner = find_tagged(text, "response")
    if inner is None:
        inner = next((ln for ln in text.splitlines() if re.search(r"\d", ln)), "")
    numbers = [int(x) for x in re.findall(r"\d+", inner)]
    if not numbers:
        raise ParseError(f"no idea numbers (1-{n}) in reply {snippet(text)}")
    out: list[int] = []
    for x in numbers:
        if not 1 <= x <= n:
            raise ParseError(f"idea number {x} is not one of 1-{n} in reply {snippet(text)}")
        if x - 1 not in out:
            out.append(x - 1)
    return out[: max(1, k)]


_HEADER = re.compile(r"^\s*##\s*[A-Za-z_][\w.\-]*\s*##\s*$")
_BLOCKISH = re.compile(r"^\s*(?:##.*##|\d+\s*:.*|\w+\s*->\s*\w+)?\s*$")


def _trim(body: str, cut: bool) -> str | None:
    """From the first ##header## line on; with `cut`, only up to the last line that
    looks like block syntax (a bare reply's closing prose goes)."""
    lines = body.splitlines()
    start = next((i for i, ln in enumerate(lines) if _HEADER.match(ln)), None)
    if start is None:
        return None
    end = start + 1
    while end < len(lines) and (not cut or _BLOCKISH.match(lines[end])):
        end += 1
    return "\n".join(ln.strip() for ln in lines[start:end]).strip() + "\n"


def parse_block_reply(text: str) -> str:
    """The block file in a reply: inside ``<block>`` tags, a code fence (```block
    preferred), or bare from its first ``##Name##`` line to the end of the block
    syntax; it must parse (`parse_block_file`)."""
    tagged = find_tagged(text, "block")
    found = fences(text if tagged is None else tagged)
    fenced = [body for label, body in found if label == "block"] or [body for _, body in found]
    bodies = [(body, False) for body in fenced[::-1]]     # the last fence: the final answer
    if tagged is not None:
        bodies.append((tagged, False))
    bodies.append((text, True))
    block = next((t for body, cut in bodies if (t := _trim(body, cut)) is not None), None)
    if block is None:
        raise ParseError(f"no block file (a ##Name## header line) in reply {snippet(text)}")
    try:
        parse_block_file(block, "reply")
    except EncodingError as err:
        raise ParseError(f"the block file does not parse: {err}") from None
    return block


_LEAD = re.compile(r"^\s*(?:[-*•]\s*|\d+[.)]\s*)?(?:\*\*)?(?:tip|suggestion)s?\s*(?:\*\*)?\s*[:\-]\s*", re.IGNORECASE)


def parse_short(text: str, tag: str, limit: int = MAX_WORDS) -> str:
    """The text inside ``<tag>`` (or the whole reply), one line, cut at `limit` words."""
    try:
        body = extract_tagged(text, tag)
    except ParseError:
        body = text
    body = re.sub(r"</?\w+>", " ", body)              # stray tags
    body = _LEAD.sub("", body.strip()).strip().strip('"').strip()
    words = body.split()
    if not words:
        raise ParseError(f"empty {tag} in reply {snippet(text)}")
    return " ".join(words[:limit])


# -- agents -----------------------------------------------------------------------------------------------

def _score(value: float | None) -> str:
    return "not measured yet" if value is None else f"{value:.4g}"


def _bulleted(items: list[str], empty: str) -> str:
    items = [" ".join(str(i).split()) for i in items if str(i).strip()]
    return "\n".join(f"- {i}" for i in items) if items else empty


def _fenced(block: str) -> str:
    return "```block\n" + block.strip("\n") + "\n```"


def _tagged_grammar(tag: str, limit: int = MAX_WORDS) -> str:
    return (f'root ::= {gbnf_literal(f"<{tag}>")} word (" " word){{0,{limit - 1}}} {gbnf_literal(f"</{tag}>")}\n'
            'word ::= [^ \\t\\n<>]{1,32}\n')


def propose(client: LLMClient, block: str, score: float | None, parent_score: float | None,
            tried: list[tuple[str, str]], ideas: list[str], *, k: int = 3,
            grammar: bool = True) -> Answer[list[int]]:
    """The Proposer: indices into `ideas` (best first, at most k, no repeats).

    `ideas` are shown numbered from 1 as given (put tags in the strings, e.g.
    ``"[block*attention] ..."``); `tried` holds (idea, outcome) pairs of this node."""
    if not ideas:
        return Answer(errors=["propose: no candidate ideas to rank"])
    n, k = len(ideas), max(1, min(k, len(ideas)))
    values = {
        "block": _fenced(block),
        "score": _score(score),
        "parent_score": _score(parent_score),
        "tried": _bulleted([f"{idea} -> {outcome}" for idea, outcome in tried], "none yet"),
        "ideas": "\n".join(f"{i}. {' '.join(idea.split())}" for i, idea in enumerate(ideas, start=1)),
        "k": k,
        "example": ", ".join(str(i) for i in range(1, k + 1)),
    }
    number = gbnf_choice(str(i) for i in range(n, 0, -1))
    gbnf = f'root ::= number ("," " "? number){{0,{k - 1}}}\nnumber ::= {number}\n'

    def parse(reply: Reply) -> list[int]:
        return parse_ranking(reply.text, n, k)

    return client.ask("proposer", load_prompt("nader_proposer"), values, parse,
                      grammar=gbnf if grammar else None)


def _constrained(block: str, sections: tuple[str, ...]) -> tuple[str, str]:
    """The block grammar for a reply, and `block` as the Modifier sees it.

    Headers are fixed to the names in `block`; sizes are bounded by the block's
    own (its largest section among `sections`) plus `GROW_NODES`/`GROW_EDGES`,
    so a weak model that loops stops well inside max_tokens. Single-input
    sections among `sections` are tight and shown in that layout (`tight_text`),
    so the model can copy what it may write. Where `block` does not parse: the
    syntactic grammar at its largest and `block` as it is."""
    try:
        parsed = parse_block_file(block, "block")
    except EncodingError:
        return block_grammar(sections=sections), block
    names: dict[str, str] = {}
    texts: list[str] = []
    tight: list[str] = []
    nodes = edges = 0
    for name, section in parsed.sections.items():
        role = role_of(name)
        names.setdefault(role, name)
        texts.append(section.to_text())
        if role not in sections:
            continue
        nodes, edges = max(nodes, len(section.nodes)), max(edges, len(section.edges))
        try:
            texts[-1] = tight_text(section)
        except EncodingError:
            continue  # a two-input cell or a broken section: the syntactic grammar
        tight.append(role)
    gbnf = block_grammar(sections=sections, name=names, max_nodes=min(MAX_NODES, nodes + GROW_NODES),
                         max_edges=min(MAX_EDGES, edges + GROW_EDGES), tight=tuple(tight))
    return gbnf, "".join(texts) if tight else block


def modify(client: LLMClient, block: str, idea: str, experiences: list[str], *, previous: str | None = None,
           error: str | None = None, attempt: int = 0, grammar: bool = True,
           sections: tuple[str, ...] = ("base",)) -> Answer[str]:
    """The Modifier: the new block file text (it parses; the verifier judges it).

    `experiences`: tips and suggestions (the first `MAX_EXPERIENCES` are shown);
    `previous`/`error`: the last draft and the verifier's line on an LIF retry;
    `attempt` is the call's attempt number, so each retry is its own cache key.
    `sections`: what the reply may hold — the base section (required) and, if
    listed, new stem/downsample sections (optional); the prompt says so and the
    grammar enforces it. Sections a reply leaves out stay the parent's."""
    if not sections or sections[0] != "base" or not set(sections) <= {"base", "stem", "downsample"}:
        raise ValueError(f"modify: sections must be 'base' followed by 'stem'/'downsample', got {sections!r}")
    retry = ""
    if error:
        if previous:
            retry = (f"\nYour previous draft was rejected:\n{_fenced(previous)}\n"
                     f"Checker: {' '.join(error.split())}\n"
                     "Correct this error (keep what was right) and write the whole block file again.\n")
        else:
            retry = (f"\nYour previous answer could not be used: {' '.join(error.split())}\n"
                     "Write the whole block file again.\n")
    others = [s for s in sections if s != "base"]
    if others:
        scope = (f"Rewrite the {' or '.join(f'_{s}' for s in others)} section only if the idea needs it; "
                 "sections you leave out stay as they are.")
    else:
        scope = "Write the base section only; the other sections stay as they are."
    gbnf, shown = _constrained(block, sections) if grammar else (None, block)
    values = {
        "language": block_language(),
        "block": _fenced(shown),
        "idea": " ".join(idea.split()),
        "scope": scope,
        "experiences": _bulleted(list(experiences)[:MAX_EXPERIENCES], "none yet"),
        "retry": retry,
    }
    return client.ask("modifier", load_prompt("nader_modifier"), values,
                      lambda reply: parse_block_reply(reply.text), grammar=gbnf, first_attempt=attempt)


def reflect_tip(client: LLMClient, idea: str, errors: list[str], *, grammar: bool = True) -> Answer[str]:
    """The Reflector after failed attempts: one general tip of at most 50 words."""
    if not errors:
        return Answer(errors=["reflect_tip: no errors to reflect on"])
    values = {
        "language": block_language(),
        "idea": " ".join(idea.split()),
        "errors": _bulleted(errors, "none"),
    }
    return client.ask("reflector", load_prompt("nader_reflector_tip"), values,
                      lambda reply: parse_short(reply.text, "tip"),
                      grammar=_tagged_grammar("tip") if grammar else None)


def reflect_suggestion(client: LLMClient, idea: str, parent_block: str, child_block: str, parent_score: float,
                       child_score: float, *, grammar: bool = True) -> Answer[str]:
    """The Reflector after a child scored below its parent: one suggestion of at most 50 words."""
    values = {
        "idea": " ".join(idea.split()),
        "parent_block": _fenced(parent_block),
        "child_block": _fenced(child_block),
        "parent_score": _score(parent_score),
        "child_score": _score(child_score),
    }
    return client.ask("reflector", load_prompt("nader_reflector_suggestion"), values,
                      lambda reply: parse_short(reply.text, "suggestion"),
                      grammar=_tagged_grammar("suggestion") if grammar else None)
