"""FairNAD's agents (its Appendix F.2) as one LLM call each, on model source files.

* `mutate` — apply a request (an idea formatted for its mutation target, or a
  refinement idea) to a parent model;
* `iterate` — stage III: compare a parent with the mutation that made it and
  write the next model, with the improved or the degraded prompt variant;
* `debug` / `downscale` — the feedback loop: fix a model that fails to build or
  run, shrink one that is over budget.

Replies are whole model files, checked here only for syntax and a `Network`
class (`ast`, nothing runs): running them is the sandbox's job. Each call
returns an `Answer` — LLM and parse failures are in `Answer.errors`, never raised.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass

from nas.llm.client import Answer, LLMClient, Reply
from nas.llm.parse import ParseError, extract_code, find_tagged, snippet
from nas.llm.prompts import load_prompt
from nas.spaces.nader.dag.macro import WIDTH_MULTIPLE

MAX_IDEA_WORDS = 50
MAX_TRACE_LINES = 12

# The mutation target by the idea's granularity (FairNAD F.2.3, our wording):
# operation and block ideas go to a new module or an existing one (drawn
# uniformly), network ideas to the Network class.
TARGETS = {
    "new": "Create a new module that realises this idea and use it in the model: {idea}",
    "modify": "Change an existing module (not the Network class) according to this idea: {idea}",
    "network": "Change the structure of the Network class according to this idea: {idea}",
}

# Stage II refinements: upscaling for parents under 0.9 of a budget, otherwise
# hyper-parameters other than width and depth (FairNAD 4.3.2; our wording).
UPSCALE_IDEAS = (
    "Make the network slightly wider: raise the channel numbers of every stage by the same factor.",
    "Make the network slightly deeper: add one or two blocks to the stage with the most blocks.",
    "Make the network slightly deeper in its last stage, where the feature maps are smallest.",
    "Widen the later stages more than the early ones, keeping the channel ratios increasing.",
)
HYPER_IDEAS = (
    "Change kernel sizes: use a larger kernel in some convolutions of the blocks.",
    "Change where the network downsamples: move a stride-2 step to a different stage.",
    "Change the expansion or bottleneck ratio inside the blocks.",
    "Change the activation function used in the blocks.",
)
# Feedback-loop downscaling (FairNAD F.2.5, our wording): a model over 1.5 τ
# uses the new module once; otherwise depth or width shrinks.
DOWNSCALE_ONCE = ("Use the added or changed module only once in the network (for example after the last stage) "
                  "and keep the original blocks elsewhere.")
DOWNSCALE_SHRINK = (
    "Use slightly fewer blocks per stage, keeping the most blocks in the middle stage.",
    "Use slightly fewer blocks per stage, keeping the most blocks in the last stage.",
    "Use slightly smaller channel numbers, keeping the ratios between stages.",
    "Use slightly smaller channel numbers, changing the ratios between stages.",
)


@dataclass(frozen=True)
class Design:
    """An iterative-mutation reply: the new idea (may be empty) and the model file."""

    idea: str
    source: str


def parse_model_reply(text: str) -> str:
    """The model file in a reply: the longest ```python fence (or bare code); it
    must parse and define a `Network` class."""
    code = extract_code(text, "python")
    try:
        tree = ast.parse(code)
    except SyntaxError as err:
        raise ParseError(f"the model code does not parse: line {err.lineno}: {err.msg}") from None
    if not any(isinstance(n, ast.ClassDef) and n.name == "Network" for n in tree.body):
        raise ParseError(f"the model code defines no top-level class Network in reply {snippet(text)}")
    return code


def parse_design_reply(text: str) -> Design:
    """`<idea>…</idea>` (optional, cut to 50 words) and the model file."""
    idea = " ".join((find_tagged(text, "idea") or "").split()[:MAX_IDEA_WORDS])
    return Design(idea, parse_model_reply(text))


def _model(reply: Reply) -> str:
    return parse_model_reply(reply.text)


def _score(value: float | None) -> str:
    return "not measured" if value is None else f"{value:.4g}"


def mutate(client: LLMClient, parent: str, request: str, *, attempt: int = 0, tries: int = 2) -> Answer[str]:
    """The Mutator: `parent` changed as `request` says (a whole model file)."""
    values = {"request": " ".join(request.split()), "parent": parent.strip("\n")}
    return client.ask("mutator", load_prompt("fairnad_mutator"), values, _model, tries=tries,
                      first_attempt=attempt)


def iterate(client: LLMClient, parent: str, current: str, idea: str, parent_score: float | None,
            score: float | None, attributes: str, *, attempt: int = 0, tries: int = 2) -> Answer[Design]:
    """Stage III: `current` came from `parent` with `idea`; the improved variant
    builds on `current`, the degraded one starts again from `parent`."""
    improved = score is not None and parent_score is not None and score > parent_score
    values = {
        "attributes": attributes,
        "refinements": "\n".join(f"- {i}" for i in UPSCALE_IDEAS + HYPER_IDEAS),
        "idea": " ".join(idea.split()),
        "parent_score": _score(parent_score),
        "score": _score(score),
        "parent": parent.strip("\n"),
        "current": current.strip("\n"),
    }
    prompt = load_prompt("fairnad_iterate_improved" if improved else "fairnad_iterate_degraded")
    return client.ask("mutator", prompt, values, lambda reply: parse_design_reply(reply.text), tries=tries,
                      first_attempt=attempt)


def debug(client: LLMClient, source: str, parent: str, request: str, error: str, trace: str | None = None, *,
          attempt: int = 0) -> Answer[str]:
    """The Debugger: `source` fixed for `error` (the last lines of the traceback are shown)."""
    tail = "\n".join((trace or "").strip().splitlines()[-MAX_TRACE_LINES:])
    values = {
        "request": " ".join(request.split()),
        "error": " ".join(error.split()),
        "trace": f"Traceback (last lines):\n{tail}\n" if tail else "",
        "source": source.strip("\n"),
        "parent": parent.strip("\n"),
    }
    return client.ask("debugger", load_prompt("fairnad_debugger"), values, _model, first_attempt=attempt)


def downscale(client: LLMClient, source: str, parent: str, request: str, over: str, how: str, *,
              attempt: int = 0, multiple: int = WIDTH_MULTIPLE) -> Answer[str]:
    """Model downscaling: `source` made smaller `how`, keeping the added module, with
    channel counts kept to multiples of `multiple` (as the block-file width search)."""
    values = {"request": " ".join(request.split()), "over": over, "how": how, "multiple": str(multiple),
              "source": source.strip("\n"), "parent": parent.strip("\n")}
    return client.ask("mutator", load_prompt("fairnad_downscale"), values, _model, first_attempt=attempt)


# layer -> its channel arguments, in positional order: the literal counts `off_multiple` checks
_CHANNEL_ARGS = {"Conv2d": ("in_channels", "out_channels"), "BatchNorm2d": ("num_features",)}


def off_multiple(source: str, multiple: int = WIDTH_MULTIPLE) -> list[str]:
    """Literal channel counts in `source` that are not multiples of `multiple` ("line 12:
    Conv2d out_channels=20"), read from the syntax tree (nothing runs): whether a downscaled
    model kept the prompt's width constraint. Counts computed at run time are not seen; the
    image's channels (1 or 3) are allowed."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
        names = _CHANNEL_ARGS.get(name, ())
        given = dict(zip(names, node.args)) | {k.arg: k.value for k in node.keywords if k.arg in names}
        for arg, value in given.items():
            if (isinstance(value, ast.Constant) and type(value.value) is int and value.value % multiple
                    and value.value not in (1, 3)):
                found.append(f"line {node.lineno}: {name} {arg}={value.value}")
    return found
