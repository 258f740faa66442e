"""NADER's agents (Proposer, Modifier, Reflector) against the scripted loopback
server, and the block-file GBNF grammar checked by llama.cpp's own grammar
engine: it must parse, accept every packaged block file (every single-input
section also in the tight layout) and reject malformed ones. The slow test asks
the real embedded model for a constrained block."""

from __future__ import annotations

import ctypes
import math
import re
from pathlib import Path

import pytest

from nas.agents.nader.agents import (
    block_language,
    modify,
    parse_block_reply,
    parse_ranking,
    parse_short,
    propose,
    reflect_suggestion,
    reflect_tip,
)
from nas.errors import EncodingError
from nas.llm import LLMClient, ParseError
from nas.spaces.nader.dag.canon import block_key
from nas.spaces.nader.dag.grammar import block_grammar, tight_text
from nas.spaces.nader.dag.ops import OPS
from nas.spaces.nader.dag.parse import parse_block_file
from support.scripted import ScriptedServer

ROOT = Path(__file__).resolve().parents[1]
SHARED = Path("/work/shared/data/nader")
BLOCK_FILES = sorted((ROOT / "tests/data/blocks").glob("*.txt"))
SHARED_FILES = sorted(SHARED.glob("blocks/*.txt")) + sorted(SHARED.glob("blocks-cifar/*.txt")) \
    + sorted(SHARED.glob("darts/*.txt"))
RESIDUAL = (ROOT / "tests/data/blocks/residual.txt").read_text()
BASE = RESIDUAL.split("##Residual_stem##")[0]
NEW_BASE = """##Residual##
0:input
1:output
2:Conv2d(out_channels=C,kernel_size=3)
3:BN
4:ReLU
5:AdaptiveAvgPool2d(output_size=1)
6:Sigmoid
7:Mul
8:Add
0->2
2->3
3->4
4->5
5->6
4->7
6->7
7->8
0->8
8->1
"""


def make_client(server, tmp_path, **overrides) -> LLMClient:
    cfg = {"backend": "openai", "base_url": server.base_url, "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
           "timeout_s": 5, "max_retries": 0, "backoff_s": 0.01, "cache_dir": str(tmp_path / "cache"),
           "structured": "grammar", **overrides}
    return LLMClient(cfg, sleep=lambda s: None)


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-nader")


def user_text(request: dict) -> str:
    return "\n".join(m["content"] for m in request["messages"])


# -- llama.cpp's grammar engine as a recogniser ----------------------------------------------------------

class Gbnf:
    """llama.cpp's own GBNF parser and matcher over SmolLM2's vocabulary (loaded
    vocab-only, no weights): `valid` parses a grammar, `accepts` feeds a text
    token by token through the grammar sampler, checking each token is allowed
    before accepting it (accepting a forbidden token aborts in C++), then asks
    whether end-of-text is allowed."""

    def __init__(self) -> None:
        llama = pytest.importorskip("llama_cpp")
        from nas.llm.local import model_path

        try:
            path = model_path()
        except Exception as err:  # noqa: BLE001 - no packaged model: skip, as the local tests do
            pytest.skip(str(err))
        self.L = llama
        self._quiet = llama.llama_log_callback(lambda level, text, data: None)
        llama.llama_log_set(self._quiet, ctypes.c_void_p(0))
        llama.llama_backend_init()
        params = llama.llama_model_default_params()
        params.vocab_only = True
        self.model = llama.llama_model_load_from_file(str(path).encode(), params)
        assert self.model, "could not load the vocabulary"
        self.vocab = llama.llama_model_get_vocab(self.model)
        self.eos = llama.llama_vocab_eos(self.vocab)

    def sampler(self, grammar: str):
        return self.L.llama_sampler_init_grammar(self.vocab, grammar.encode(), b"root")

    def valid(self, grammar: str) -> bool:
        s = self.sampler(grammar)
        if s:
            self.L.llama_sampler_free(s)
        return bool(s)

    def _allowed(self, s, token: int) -> bool:
        data = (self.L.llama_token_data * 1)(self.L.llama_token_data(token, 0.0, 0.0))
        arr = self.L.llama_token_data_array(data, 1, -1, False)
        self.L.llama_sampler_apply(s, ctypes.byref(arr))
        return not math.isinf(data[0].logit)

    def accepts(self, grammar: str, text: str) -> bool:
        s = self.sampler(grammar)
        assert s, "grammar does not parse"
        try:
            raw = text.encode()
            buf = (self.L.llama_token * (len(raw) + 8))()
            n = self.L.llama_tokenize(self.vocab, raw, len(raw), buf, len(buf), False, False)
            assert n >= 0
            for i in range(n):
                if not self._allowed(s, buf[i]):
                    return False
                self.L.llama_sampler_accept(s, buf[i])
            return self._allowed(s, self.eos)
        finally:
            self.L.llama_sampler_free(s)

    def close(self) -> None:
        self.L.llama_model_free(self.model)


@pytest.fixture(scope="module")
def gbnf():
    g = Gbnf()
    yield g
    g.close()


ALL = ("base", "stem", "downsample")


def test_llama_cpp_supports_bounded_repetition(gbnf):
    g = 'root ::= "a"{2,3}\n'
    assert gbnf.valid(g) and not gbnf.valid('root ::= undefined-rule\n')
    assert [gbnf.accepts(g, "a" * n) for n in range(1, 5)] == [False, True, True, False]


@pytest.mark.parametrize("kwargs", [
    {}, {"sections": ALL}, {"sections": ALL, "optional": ()}, {"name": "Residual", "sections": ALL},
    {"name": {"base": "DARTSv2_base", "stem": "stem_block"}, "sections": ALL},
    {"ops": ["Conv2d", "BN", "ReLU", "Add", "MyOp"]}, {"max_nodes": 2, "max_edges": 1},
    {"sections": ("stem", "downsample")}, {"tight": ("base",)}, {"tight": ("base",), "max_nodes": 3},
    {"sections": ALL, "tight": ALL, "name": "Residual"}, {"sections": ALL, "tight": ("stem",)},
])
def test_grammar_parses_in_llama_cpp(gbnf, kwargs):
    assert gbnf.valid(block_grammar(**kwargs))


@pytest.mark.parametrize("path", BLOCK_FILES + SHARED_FILES, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_every_packaged_block_file_is_accepted(gbnf, path):
    text = path.read_text()
    assert gbnf.accepts(block_grammar(sections=ALL), text)
    sections = parse_block_file(text, str(path)).sections
    names = {("stem" if n.lower().endswith("_stem") or n.lower().startswith("stem") else
              "downsample" if "downsample" in n.lower() else "base"): n for n in sections}
    assert gbnf.accepts(block_grammar(sections=ALL, name=names), text)
    base = re.split(r"\n(?=##)", text)[0] + "\n"   # the base section alone: the default grammar
    assert gbnf.accepts(block_grammar(), base)


def test_files_are_present():
    assert len(BLOCK_FILES) >= 4
    if not SHARED.is_dir():
        pytest.skip("no /work/shared/data/nader")
    assert SHARED_FILES


@pytest.mark.parametrize("text, why", [
    (BASE.replace("4:ReLU", "4:Swish"), "unknown op"),
    (BASE.replace("4:ReLU", "4:ReLU()"), "ReLU takes no arguments"),
    (BASE.replace("3:BN", "3:AdaptiveAvgPool2d(out_channels=C)"), "argument name of another op"),
    (BASE.replace("kernel_size=3)", "kernel_size=k)", 1), "not a block variable"),
    (BASE.replace("kernel_size=3)", "kernel_size=3", 1), "unbalanced parenthesis"),
    (BASE.replace("2:Conv2d(out_channels=C,kernel_size=3)", "2:Conv2d"), "Conv2d needs its arguments"),
    (BASE.replace("(out_channels=C,kernel_size=3)", "(out_channels=C)", 1), "a required argument missing"),
    (BASE.replace("(out_channels=C,kernel_size=3)", "(kernel_size=3,out_channels=C)", 1), "not the registry's order"),
    (BASE.replace("kernel_size=3,stride=1", "kernel_size=3,stride=1,stride=2"), "an argument repeated"),
    (BASE.replace("0->2", "a->2"), "edge endpoint is not a number"),
    (BASE.replace("##Residual##\n", ""), "no header"),
    (BASE.replace("3:BN\n", "3:BN\nThis adds attention.\n"), "prose line"),
    (BASE.replace("0->2\n", "0->2\n\n"), "blank line"),
    (BASE + "8->1\n2:BN\n", "node after edges"),
    ("##Residual##\n0:input\n1:output\n", "no edge"),
    (RESIDUAL, "stem section when only base is asked for"),
    ("```block\n" + BASE + "```\n", "fenced"),
    (BASE.replace("kernel_size=3)", "kernel_size=-3)", 1), "a size with a unary minus"),
    (BASE.replace("kernel_size=3)", "kernel_size=3,stride=-(1))", 1), "a size with a unary minus inside parentheses"),
    (BASE.replace("kernel_size=3)", "kernel_size=3,padding=(0.5))", 1), "a decimal where a whole number goes"),
    (BASE.replace("kernel_size=3)", "kernel_size=1.5)", 1), "a decimal kernel size"),
])
def test_grammar_rejects(gbnf, text, why):
    assert gbnf.accepts(block_grammar(), BASE)
    assert not gbnf.accepts(block_grammar(), text), why


def test_grammar_bounds_and_fixed_names(gbnf):
    lines = "\n".join(f"{i}:ReLU" for i in range(2, 7))
    text = f"##A##\n0:input\n1:output\n{lines}\n0->1"
    assert gbnf.accepts(block_grammar(max_nodes=7), text)
    assert not gbnf.accepts(block_grammar(max_nodes=6), text)
    assert gbnf.accepts(block_grammar(name="A"), text)
    assert not gbnf.accepts(block_grammar(name="B"), text)
    two = text + "\n##A_stem##\n0:input\n1:output\n0->1\n"
    assert gbnf.accepts(block_grammar(sections=ALL, name="A"), two)
    assert not gbnf.accepts(block_grammar(sections=ALL, name="A"), two.replace("A_stem", "X_stem"))
    assert not gbnf.accepts(block_grammar(sections=ALL, optional=(), name="A"), two)  # downsample required
    spaced = text.replace("0:input", "0:input\n7:permute(0, 2, 3, 1)")
    assert gbnf.accepts(block_grammar(), spaced)
    assert gbnf.accepts(block_grammar(), text.replace("2:ReLU", "2:reshape(B,-1,(H+1)//2*(W-(1)),W)"))
    for written in ("Conv2d(out_channels=C-1,kernel_size=3,padding=-1)", "Conv2d(out_channels=(C+1)//2,kernel_size=3)",
                    "concat(dim=-1)", "DropPath(drop_prob=0.25)"):  # what the value rules still take
        assert gbnf.accepts(block_grammar(), text.replace("2:ReLU", f"2:{written}")), written


TIGHT = block_grammar(tight=("base",))
TIGHT_BASE = """##Residual##
0:input
1:output
2:Conv2d(out_channels=C,kernel_size=3)
0->2
3:BN
2->3
4:ReLU
3->4
5:Conv2d(out_channels=C,kernel_size=3,stride=1)
4->5
6:BN
5->6
7:Add
0->7
6->7
8:ReLU
7->8
8->1
"""
SINGLE_INPUT = [(path, name) for path in BLOCK_FILES + SHARED_FILES
                for name, section in parse_block_file(path.read_text(), str(path)).sections.items()
                if not any(node.op == "input1" for node in section.nodes.values())]


def tight(text: str) -> str:
    return "".join(tight_text(section) for section in parse_block_file(text).sections.values())


def test_tight_text_lays_out_each_node_with_its_inputs():
    assert tight(BASE) == TIGHT_BASE
    swapped = BASE.replace("7:Add\n8:ReLU", "7:ReLU\n8:Add").replace("6->7\n0->7\n7->8\n8->1",
                                                                    "6->8\n0->8\n8->7\n7->1")
    assert tight(swapped) == TIGHT_BASE   # NADER's resnet_base numbers 8:Add before 7:ReLU


@pytest.mark.parametrize("path, name", SINGLE_INPUT, ids=lambda x: x.name if isinstance(x, Path) else x)
def test_tight_grammar_accepts_every_single_input_section_in_tight_layout(gbnf, path, name):
    section = parse_block_file(path.read_text(), str(path)).sections[name]
    text = tight_text(section)
    assert block_key(parse_block_file(text).sections[name]) == block_key(section)
    assert gbnf.accepts(TIGHT, text)


def test_tight_text_keeps_the_input_order_of_ordered_ops():
    backwards = "##B##\n0:input\n1:output\n2:ReLU\n3:concat\n4:Add\n" \
                "0->2\n2->3\n0->3\n2->4\n0->4\n3->4\n4->1\n"   # concat(ReLU(x), x); Add(ReLU(x), x, concat)
    text = tight(backwards)
    assert "3:concat\n2->3\n0->3\n4:Add\n0->4\n2->4\n3->4\n4->1" in text
    assert block_key(parse_block_file(text).sections["B"]) == block_key(parse_block_file(backwards).sections["B"])


def test_tight_text_refuses_two_input_cells_and_broken_blocks():
    cell = parse_block_file((ROOT / "tests/data/blocks/two_input_cell.txt").read_text()).sections["TwoInputCell"]
    with pytest.raises(EncodingError, match="two-input cell"):
        tight_text(cell)
    with pytest.raises(EncodingError, match="does not reach output"):
        tight_text(parse_block_file(BASE.replace("6->7\n", "")).sections["Residual"])


@pytest.mark.parametrize("text, why", [
    (TIGHT_BASE.replace("8->1", "8->9\n9->1"), "an edge to an undefined node"),
    (TIGHT_BASE.replace("7->8", "9->8"), "an edge from an undefined node"),
    (TIGHT_BASE.replace("8:ReLU\n7->8\n8->1", "9:ReLU\n7->9\n9->1"), "node indices skip 8"),
    (TIGHT_BASE.replace("3:BN", "3:input"), "a second input node"),
    (TIGHT_BASE.replace("0:input\n1:output", "0:output\n1:input"), "I/O nodes swapped"),
    (TIGHT_BASE.replace("8->1", "7->1\n8->1"), "two edges into output"),
    (TIGHT_BASE.replace("8->1", "7->1"), "the edge into output not from the last node"),
    (TIGHT_BASE.replace("2->3", "1->3"), "an edge out of output"),
    (TIGHT_BASE.replace("2->3", "2->3\n3->0"), "an edge into input"),
    (TIGHT_BASE.replace("3->4", "3->4\n5->4"), "a backward edge (a cycle 4->5->4)"),
    (TIGHT_BASE.replace("4->5", "4->5\n5->5"), "a self-loop"),
    (TIGHT_BASE.replace("2->3\n", ""), "a node without an incoming edge"),
    (TIGHT_BASE.replace("3->4", "2->4\n3->4"), "ReLU with two inputs"),
    (TIGHT_BASE.replace("0->7\n", ""), "Add with one input"),
    (TIGHT_BASE.replace("6->7", "6->7\n6->7"), "an edge repeated"),
    (TIGHT_BASE.replace("0->7\n6->7", "6->7\n0->7"), "Add's inputs out of increasing order"),
    (TIGHT_BASE.replace("7:Add\n0->7\n6->7", "7:concat\n6->7"), "concat with one input"),
    (TIGHT_BASE.replace("7:Add\n0->7\n6->7", "7:Multiply\n6->7\n0->7\n5->7"), "Multiply with three inputs"),
    (BASE, "all edges after the nodes"),
])
def test_tight_grammar_rejects(gbnf, text, why):
    assert gbnf.accepts(TIGHT, TIGHT_BASE) and gbnf.accepts(TIGHT, tight(NEW_BASE))
    assert not gbnf.accepts(TIGHT, text), why


def test_tight_grammar_bounds_the_node_count_and_knows_unregistered_ops(gbnf):
    chain = "".join(f"{i}:ReLU\n{i - 1}->{i}\n" for i in range(3, 7))
    text = f"##A##\n0:input\n1:output\n2:ReLU\n0->2\n{chain}6->1"
    assert gbnf.accepts(block_grammar(tight=("base",), max_nodes=7), text)
    assert not gbnf.accepts(block_grammar(tight=("base",), max_nodes=6), text)
    assert not gbnf.accepts(TIGHT, "##A##\n0:input\n1:output\n0->1"), "no op node"
    mine = block_grammar(ops=["ReLU", "MyOp"], tight=("base",))
    assert gbnf.accepts(mine, text.replace("3:ReLU\n2->3", "3:MyOp(k=1)\n0->3\n2->3"))
    assert not gbnf.accepts(mine, text.replace("3:ReLU", "3:Add"))
    concat = TIGHT_BASE.replace("7:Add\n0->7\n6->7", "7:concat\n6->7\n0->7")   # concat keeps its order
    assert gbnf.accepts(TIGHT, concat) and gbnf.accepts(TIGHT, concat.replace("7:concat", "7:Multiply"))


@pytest.mark.parametrize("kwargs, message", [
    ({"sections": ("head",)}, "sections must be"), ({"sections": ()}, "sections must be"),
    ({"sections": ("base", "base")}, "repeat"), ({"sections": ALL, "optional": ("base",)}, "cannot be optional"),
    ({"name": "bad name"}, "identifiers"), ({"name": {"tail": "X"}}, "roles are"),
    ({"ops": ["input"]}, "not usable"), ({"ops": []}, "no ops"), ({"max_nodes": 1}, "at least 2 nodes"),
    ({"tight": ("stem",)}, "tight sections"), ({"tight": ("base",), "max_nodes": 2}, "room for 3 nodes"),
    ({"tight": ("base",), "ops": ["Add"]}, "takes one input"),
])
def test_grammar_arguments_are_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        block_grammar(**kwargs)


def test_grammar_lists_the_registry():
    g = block_grammar()
    for op in OPS:
        assert f'"{op}"' in g
    assert '"out_channels"' in g and '"Swish"' not in g
    assert "Swish" in block_grammar(ops=["Swish", "ReLU"]) and '"Conv2d"' not in block_grammar(ops=["ReLU"])


# -- parsers ----------------------------------------------------------------------------------------------

def test_parse_ranking():
    assert parse_ranking("2, 1, 3", 3, 3) == [1, 0, 2]
    assert parse_ranking("<response>3,3,1,2</response>", 3, 2) == [2, 0]
    assert parse_ranking("Ranking:\nI pick 2 then 1.\nBecause 4 layers", 3, 3) == [1, 0]
    with pytest.raises(ParseError, match=r"idea number 7 is not one of 1-3"):
        parse_ranking("7, 1", 3, 3)
    with pytest.raises(ParseError, match=r"no idea numbers \(1-3\)"):
        parse_ranking("the second one", 3, 3)


@pytest.mark.parametrize("reply", [
    f"```block\n{NEW_BASE}```",
    f"Here is the block:\n```\n{NEW_BASE}```\nIt adds a gate.",
    f"```python\nprint(1)\n```\n```block\n{NEW_BASE}```",
    f"A first draft:\n```block\n{TIGHT_BASE}```\nOn second thought, with a gate:\n```block\n{NEW_BASE}```",  # the last
    f"<block>\n{NEW_BASE}</block>",
    f"<block>```block\n{NEW_BASE}```</block>",
    f"Sure.\n{NEW_BASE}\nThis adds a channel gate before the residual sum.",
    NEW_BASE.rstrip("\n"),
    "\n".join("  " + ln for ln in NEW_BASE.splitlines()),
])
def test_parse_block_reply_forms(reply):
    assert parse_block_reply(reply) == NEW_BASE


@pytest.mark.parametrize("reply, message", [
    ("I cannot do that.", r"no block file \(a ##Name## header line\) in reply 'I cannot do that.'"),
    ("##Residual##\n0:input\n1:output\n2:Conv2d(out_channels=C\n0->2", r"does not parse: reply:4: node line"),
    ("##Residual##\n0:input\n0:output\n0->0", r"node 0 is defined twice"),
    ("```block\n##A##\n0:input\n1:output\nNow the edges:\n0->1\n```", r"reply:4: line 'Now the edges:' is neither"),
])
def test_parse_block_reply_errors(reply, message):
    with pytest.raises(ParseError, match=message):
        parse_block_reply(reply)


def test_parse_short():
    long = " ".join(f"w{i}" for i in range(80))
    assert parse_short(f"<tip>{long}</tip>", "tip") == " ".join(f"w{i}" for i in range(50))
    assert parse_short("Tip: keep   channels\nequal.", "tip") == "keep channels equal."
    assert parse_short("thinking...\n<suggestion>Keep the skip.", "suggestion") == "Keep the skip."
    assert parse_short("##tip## Use permute before LN.", "tip") == "Use permute before LN."
    with pytest.raises(ParseError, match="empty tip"):
        parse_short("<tip>  </tip>", "tip")


def test_block_language_comes_from_the_registry():
    text = block_language()
    for op in OPS:
        if op != "Concat":   # an alias of concat
            assert op in text
    assert "Conv2d(out_channels, kernel_size, stride=1" in text and "Add [2+ inputs]" in text
    assert "Multiply [2 inputs]" in text and "permute(v1,v2,...)" in text
    assert block_language(["ReLU", "Conv2d"]).count("\n- ") == 2


# -- agents against the scripted server -------------------------------------------------------------------

IDEAS = ["[block*attention] add a squeeze-and-excitation gate", "[operation*conv] use a depthwise 5x5 conv",
         "[block*shortcut] add a second skip connection"]


def test_propose_request_and_ranking(tmp_path):
    with ScriptedServer(["3, 1"]) as srv:
        client = make_client(srv, tmp_path)
        answer = propose(client, RESIDUAL, 0.7123, None, [("use GELU", "scored 0.70"), ("add dropout", "failed")],
                         IDEAS, k=2)
    assert answer.ok and answer.value == [2, 0] and not answer.errors
    req = srv.requests[0]
    text = user_text(req)
    for part in ("##Residual##", "0.7123", "not measured yet", "use GELU -> scored 0.70", "add dropout -> failed",
                 "1. [block*attention] add a squeeze-and-excitation gate", "3. [block*shortcut]", "at most 2",
                 "(for example: 1, 2)."):
        assert part in text, part
    assert req["grammar"].startswith("root ::= number") and '"3"' in req["grammar"] and '"4"' not in req["grammar"]
    assert "{0,1}" in req["grammar"]


def test_propose_grammar_is_valid_in_llama_cpp(gbnf, tmp_path):
    with ScriptedServer(["1"]) as srv:
        propose(make_client(srv, tmp_path), BASE, None, None, [], IDEAS * 4, k=3)
    g = srv.requests[0]["grammar"]
    assert gbnf.valid(g)
    assert gbnf.accepts(g, "12, 3,1") and gbnf.accepts(g, "7")
    assert not gbnf.accepts(g, "13") and not gbnf.accepts(g, "1,2,3,4") and not gbnf.accepts(g, "first")


def test_propose_failures(tmp_path):
    with ScriptedServer(["5, 1", "I like the first idea best"]) as srv:
        client = make_client(srv, tmp_path, structured="none")
        bad = propose(client, BASE, 0.7, 0.71, [], IDEAS)
        words = propose(client, BASE, 0.7, 0.72, [], IDEAS)
    assert not bad.ok and bad.errors == ["attempt 0: idea number 5 is not one of 1-3 in reply '5, 1'"]
    assert not words.ok and "no idea numbers (1-3)" in words.errors[0]
    assert all("grammar" not in r for r in srv.requests)
    with ScriptedServer([]) as srv:
        empty = propose(make_client(srv, tmp_path), BASE, None, None, [], [])
    assert not empty.ok and empty.errors == ["propose: no candidate ideas to rank"] and not srv.requests


def test_modify_request_carries_idea_glossary_and_experiences(tmp_path):
    tips = [f"tip number {i}" for i in range(7)]
    with ScriptedServer([f"```block\n{NEW_BASE}```"]) as srv:
        client = make_client(srv, tmp_path)
        answer = modify(client, RESIDUAL, "add a  channel\ngate", tips)
    assert answer.ok and answer.value == NEW_BASE
    text = user_text(srv.requests[0])
    assert "add a channel gate" in text and "##Residual_downsample##" in text
    assert all(f"tip number {i}" in text for i in range(5)) and "tip number 5" not in text
    assert "- Conv2d(out_channels, kernel_size" in text and "previous draft" not in text
    g = srv.requests[0]["grammar"]
    assert '"##Residual##"' in g and "stem" not in g and "Conv2d" in g    # the base section only
    assert "tnode-24 " in g and "tnode-25" not in g   # tight: the base's 9 nodes + 16 (indices 0-24)
    assert "Write the base section only" in text
    assert answer.replies[0].attempt == 0


def test_modify_may_rewrite_stem_and_downsample_when_asked(gbnf, tmp_path):
    with ScriptedServer([RESIDUAL]) as srv:
        client = make_client(srv, tmp_path)
        answer = modify(client, RESIDUAL, "gate", [], sections=ALL)
    assert answer.ok and answer.value == RESIDUAL
    g = srv.requests[0]["grammar"]
    assert '"##Residual_stem##"' in g and '"##Residual_downsample##"' in g
    assert "tnode-26 " in g and "tnode-27" not in g   # the largest section (11 nodes) + 16
    assert gbnf.accepts(g, tight(RESIDUAL)) and gbnf.accepts(g, tight(NEW_BASE))
    assert "```block\n" + tight(RESIDUAL) in user_text(srv.requests[0])
    assert "Rewrite the _stem or _downsample section only if" in user_text(srv.requests[0])
    with pytest.raises(ValueError, match="sections must be 'base'"):
        modify(client, RESIDUAL, "gate", [], sections=("stem",))


def test_modify_shows_the_parent_in_tight_layout(gbnf, tmp_path):
    """The parent is shown as the grammar lets the model write it, so it can copy."""
    with ScriptedServer([TIGHT_BASE]) as srv:
        answer = modify(make_client(srv, tmp_path), RESIDUAL, "gate", [])
    assert answer.ok
    text, g = user_text(srv.requests[0]), srv.requests[0]["grammar"]
    assert "```block\n" + TIGHT_BASE in text and "##Residual_stem##\n0:input\n1:output\n2:Conv2d" in text
    assert gbnf.accepts(g, TIGHT_BASE) and not gbnf.accepts(g, BASE)


def test_modify_keeps_two_input_cells_syntactic(gbnf, tmp_path):
    cell = (ROOT / "tests/data/blocks/two_input_cell.txt").read_text()
    with ScriptedServer([cell]) as srv:
        answer = modify(make_client(srv, tmp_path), cell, "gate", [], sections=ALL)
    assert answer.ok
    g, text = srv.requests[0]["grammar"], user_text(srv.requests[0])
    assert re.search(r"^sec-base +::= .* node-line", g, re.M) and re.search(r"^sec-stem +::= .* tight-body", g, re.M)
    shown = text.split("```block\n")[1].split("```")[0]
    sections = parse_block_file(cell).sections
    assert shown.startswith(sections["TwoInputCell"].to_text())          # as written
    assert tight_text(sections["TwoInputCell_stem"]) in shown
    assert gbnf.accepts(g, shown)


def test_modify_grammar_is_valid_and_admits_the_answer(gbnf, tmp_path):
    with ScriptedServer([NEW_BASE]) as srv:
        modify(make_client(srv, tmp_path), RESIDUAL, "gate", [])
    g = srv.requests[0]["grammar"]
    assert gbnf.valid(g) and gbnf.accepts(g, tight(NEW_BASE)) and gbnf.accepts(g, TIGHT_BASE)
    assert not gbnf.accepts(g, tight(RESIDUAL))    # base only by default
    assert not gbnf.accepts(g, TIGHT_BASE.replace("##Residual##", "##Other##"))


def test_modify_retry_shows_previous_draft_and_error(tmp_path):
    error = "block 'Residual': node 8: Add takes at least 2 inputs, has 1 (from node 7) [at C=64, dim=64, H=32, W=32]"
    broken = NEW_BASE.replace("0->8\n", "")
    with ScriptedServer([NEW_BASE, NEW_BASE, NEW_BASE]) as srv:
        client = make_client(srv, tmp_path)
        first = modify(client, RESIDUAL, "gate", [], attempt=0)
        retry = modify(client, RESIDUAL, "gate", [], previous=broken, error=error, attempt=1)
        again = modify(client, RESIDUAL, "gate", [], attempt=0)              # same call: cached
        third = modify(client, RESIDUAL, "gate", [], error="no block file in reply 'x'", attempt=2)
    assert first.ok and retry.ok and again.ok and third.ok
    assert len(srv.requests) == 3 and again.replies[0].source == "cache"
    assert [a.replies[0].attempt for a in (first, retry, third)] == [0, 1, 2]
    assert len({first.replies[0].key, retry.replies[0].key, third.replies[0].key}) == 3
    text = user_text(srv.requests[1])
    assert error in text and broken.strip() in text and "previous draft was rejected" in text
    assert "could not be used: no block file in reply 'x'" in user_text(srv.requests[2])


def test_modify_without_grammar_and_failures(tmp_path):
    with ScriptedServer([f"<block>{NEW_BASE}</block>", "Sorry, I am not sure.",
                         "##Residual##\n0:input\n1:output\n2:Conv2d(out_channels=C,kernel_size=3\n0->2\n2->1"]) as srv:
        client = make_client(srv, tmp_path)
        tagged = modify(client, RESIDUAL, "gate", [], grammar=False)
        garbage = modify(client, RESIDUAL, "gate", [], attempt=1)
        broken = modify(client, RESIDUAL, "gate", [], attempt=2)
    assert tagged.ok and tagged.value == NEW_BASE and "grammar" not in srv.requests[0]
    assert not garbage.ok and garbage.value is None and len(garbage.replies) == 1
    assert garbage.errors == ["attempt 1: no block file (a ##Name## header line) in reply 'Sorry, I am not sure.'"]
    assert not broken.ok and broken.errors[0].startswith("attempt 2: the block file does not parse: reply:4: ")
    assert "unbalanced parentheses" in broken.errors[0]


def test_modify_truncated_reply_is_an_error(tmp_path):
    with ScriptedServer([" ".join(["word"] * 50)]) as srv:
        client = make_client(srv, tmp_path, roles={"modifier": {"max_tokens": 10}})
        answer = modify(client, RESIDUAL, "gate", [])
    assert not answer.ok and "cut at max_tokens" in answer.errors[0]


def test_reflect_tip(tmp_path):
    long = " ".join(["word"] * 70)
    script = ["<tip>Always permute channels last before LN.</tip>", f"<tip>{long}</tip>", "<tip></tip>"]
    with ScriptedServer(script) as srv:
        client = make_client(srv, tmp_path)
        errors = ["node 4: LN normalises the last dimension", "node 7: Add takes at least 2 inputs"]
        tip = reflect_tip(client, "add layer norm", errors)
        cut = reflect_tip(client, "add layer norm twice", errors)
        empty = reflect_tip(client, "something else", errors)
    assert tip.ok and tip.value == "Always permute channels last before LN."
    assert cut.ok and len(cut.value.split()) == 50
    assert not empty.ok and empty.errors == ["attempt 0: empty tip in reply '<tip></tip>'"]
    text = user_text(srv.requests[0])
    assert "add layer norm" in text and "- node 4: LN normalises" in text and "- node 7: Add" in text
    assert "<tip>" in text and "LN:" in text
    assert srv.requests[0]["grammar"].startswith('root ::= "<tip>"')
    with ScriptedServer([]) as srv:
        none = reflect_tip(make_client(srv, tmp_path), "x", [])
    assert not none.ok and not srv.requests


def test_reflect_suggestion(tmp_path):
    with ScriptedServer(["Suggestion: keep the identity shortcut when adding gates."]) as srv:
        client = make_client(srv, tmp_path, structured="none")
        answer = reflect_suggestion(client, "add a gate", RESIDUAL, NEW_BASE, 0.7321, 0.6512)
    assert answer.ok and answer.value == "keep the identity shortcut when adding gates."
    text = user_text(srv.requests[0])
    for part in ("add a gate", "0.7321", "0.6512", "5:Conv2d(out_channels=C,kernel_size=3,stride=1)",
                 "5:AdaptiveAvgPool2d(output_size=1)", "<suggestion>"):
        assert part in text, part
    assert "grammar" not in srv.requests[0]


def test_reflector_grammar_is_valid_and_bounds_words(gbnf, tmp_path):
    with ScriptedServer(["<suggestion>x</suggestion>"]) as srv:
        reflect_suggestion(make_client(srv, tmp_path), "i", BASE, NEW_BASE, 0.7, 0.6)
    g = srv.requests[0]["grammar"]
    assert gbnf.valid(g)
    assert gbnf.accepts(g, "<suggestion>Keep the skip path.</suggestion>")
    assert gbnf.accepts(g, "<suggestion>" + " ".join(["w"] * 50) + "</suggestion>")
    assert not gbnf.accepts(g, "<suggestion>" + " ".join(["w"] * 51) + "</suggestion>")
    assert not gbnf.accepts(g, "Keep the skip path.")


# -- the real embedded model ------------------------------------------------------------------------------

@pytest.mark.slow
def test_constrained_modifier_reply_always_parses(tmp_path, monkeypatch):
    """SmolLM2-135M under the block grammar: whatever it writes is a block file
    (the verifier then judges it); a few ideas, no cache."""
    pytest.importorskip("llama_cpp")
    from nas.llm import local
    from nas.spaces.nader.dag.macro import BlockSet

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    parent = BlockSet.from_text(RESIDUAL, "parent")
    # conf/llm/local.yaml's modifier settings but greedy (temperature 0): the same reply on
    # every run, so a failure is reproducible; the grammar's size bound (parent + 16 nodes,
    # at most 4 edges into each) keeps even a looping reply inside max_tokens. One thread: the
    # server shares the cores with the other test workers, and an oversubscribed llama.cpp stalls
    # at its thread barriers (~0.6 s a token on a loaded 2-core machine, against ~0.05 s with one
    # thread); one thread also makes the greedy reply the same on every machine.
    cfg = {"backend": "local", "cache": False, "local": {"n_ctx": 4096, "n_threads": 1,
                                                          "startup_timeout_s": 180},
           "roles": {"modifier": {"temperature": 0.0, "max_tokens": 768}}}
    client = LLMClient(cfg)
    try:
        for i, (idea, sections) in enumerate([("add a squeeze-and-excitation gate after the second BN", ("base",)),
                                              ("use a depthwise 5x5 convolution", ALL)]):
            answer = modify(client, RESIDUAL, idea, ["Keep the output at C channels."], attempt=i,
                            sections=sections)
            assert answer.ok, answer.errors
            blocks = BlockSet.from_text(answer.value, "reply", fallback=parent)
            assert blocks.base.name == "Residual"
            assert answer.replies[0].text.startswith("##Residual##")
            if sections == ("base",):
                assert blocks.stem is parent.stem and blocks.downsample is parent.downsample
    finally:
        local.stop_shared()
