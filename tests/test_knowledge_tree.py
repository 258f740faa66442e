"""The attribute tree (nas.knowledge.tree) and the built-in corpus tagged with it."""

from __future__ import annotations

import copy
import json
from collections import Counter
from importlib import resources
from pathlib import Path

import pytest

from nas.errors import ConfigError
from nas.knowledge.idea import IDEA_MAX_WORDS, Tag
from nas.knowledge.tree import AttributeTree

TREE = AttributeTree.builtin()
CORPUS_LINES = (resources.files("nas.knowledge") / "data" / "corpus.jsonl").read_text(encoding="utf-8").splitlines()
CORPUS = [json.loads(line) for line in CORPUS_LINES]
IDEAS = [idea for paper in CORPUS for idea in paper["ideas"]]

FEO = "feature extraction operators"


# --- the built-in tree ---------------------------------------------------------------

def test_builtin_matches_fairnad_tables():
    assert TREE.size() == (15, 55)
    assert TREE.targets == ["performance", "efficiency"]
    assert len(TREE.mains("performance")) == 9 and len(TREE.mains("efficiency")) == 6
    assert len(set(TREE.mains())) == 15
    assert TREE.mains("performance", "operation") == [FEO, "normalization", "activation"]
    assert TREE.mains("efficiency", "network level") == ["network-wise scaling", "dynamic computation"]
    assert TREE.subs("dense connectivity for feature reuse") == []
    assert "stochastic depth" in TREE.subs("efficient block structures")
    assert TREE.subs("dynamic computation") == ["stochastic depth"]
    assert TREE.builtin() is TREE


def test_tags_have_one_leaf_per_sub_and_one_for_a_main_without_subs():
    tags = TREE.tags()
    assert len(tags) == 56 and len(set(tags)) == 56
    assert Tag("efficiency", "block", "dense connectivity for feature reuse", "") in tags
    assert len(TREE.tags("performance")) == 36
    assert all(t.target == "efficiency" for t in TREE.tags("efficiency"))
    assert TREE.main_tag("Normalization") == Tag("performance", "operation", "normalization", "")


def test_every_category_has_a_description():
    d = TREE.to_dict()
    for entries in d["targets"].values():
        for entry in entries:
            assert entry["description"].strip()
            assert all(s["description"].strip() for s in entry["subs"])


@pytest.mark.parametrize("g, display", [("operation", "operation level"),
                                        ("block", "block and connectivity level"),
                                        ("network", "network level"),
                                        ("Network Level", "network level")])
def test_granularity_display(g, display):
    assert TREE.granularity_display(g) == display


# --- check -----------------------------------------------------------------------------

ATTENTION = Tag("performance", "operation", FEO, "attention")


@pytest.mark.parametrize("tag_like, expected", [
    ("performance*operation level*feature extraction operators*attention", ATTENTION),
    ("performance*operation*feature extraction operators*attention", ATTENTION),
    ("  Performance * OPERATION  LEVEL * Feature  Extraction Operators * Attention\n", ATTENTION),
    ("`performance*operation*feature extraction operators*attention`", ATTENTION),
    (ATTENTION, ATTENTION),
    ({"target": "performance", "granularity": "operation level", "main": FEO, "sub": "ATTENTION"}, ATTENTION),
    ("performance*operation*activation*SILU", Tag("performance", "operation", "activation", "siLU")),
    ("performance*block*adaptive feature recalibration*channel attention (se block)",
     Tag("performance", "block", "adaptive feature recalibration", "channel attention (SE block)")),
    ("performance*operation*normalization", Tag("performance", "operation", "normalization", "")),
    ({"target": "efficiency", "granularity": "block", "main": "dense connectivity for feature reuse"},
     Tag("efficiency", "block", "dense connectivity for feature reuse", "")),
    ("efficiency*network level*dynamic computation*stochastic depth",
     Tag("efficiency", "network", "dynamic computation", "stochastic depth")),
])
def test_check_accepts_and_canonicalises(tag_like, expected):
    assert TREE.check(tag_like) == expected


@pytest.mark.parametrize("tag_like, fragments", [
    ("perf*operation*feature extraction operators*attention",
     ["unknown target 'perf'", "valid: performance, efficiency"]),
    ("performance*blok*feature extraction operators*attention",
     ["unknown granularity 'blok'", "operation, block, network", "block and connectivity level"]),
    ("performance*operation*attentionz",
     ["unknown main category 'attentionz' under performance/operation "
      "(valid: feature extraction operators, normalization, activation)"]),
    ("performance*block*normalization*grn",  # a real main, under the wrong granularity
     ["unknown main category 'normalization' under performance/block", "input encoding"]),
    ("efficiency*operation*feature extraction operators*attention",  # a real main, under the wrong target
     ["unknown main category 'feature extraction operators' under efficiency/operation"]),
    ("performance*operation*activation*tanh",
     ["unknown sub-category 'tanh' under activation", "siLU, gelu, relu, relu6, hardswish"]),
    ("efficiency*block*dense connectivity for feature reuse*skip",
     ["unknown sub-category 'skip'", "no sub-categories"]),
    ("performance*operation", ["got 2 part(s)"]),
    ("performance*operation*activation*relu*extra", ["got 5 part(s)"]),
    ({"target": "performance", "main": "activation"}, ["granularity"]),
    (Tag("performance", "operation", "activation", "mish"), ["unknown sub-category 'mish'"]),
])
def test_check_rejects_with_one_precise_line(tag_like, fragments):
    with pytest.raises(ValueError) as info:
        TREE.check(tag_like)
    message = str(info.value)
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message


def test_check_rejects_other_types():
    with pytest.raises(TypeError, match="int"):
        TREE.check(3)  # type: ignore[arg-type]


# --- text ------------------------------------------------------------------------------

@pytest.mark.parametrize("target", ["performance", "efficiency"])
def test_render_lists_every_main_with_its_subs(target):
    text = TREE.render(target)
    for main in TREE.mains(target):
        assert f"  {main}: [{', '.join(TREE.subs(main))}]" in text.splitlines()
    other = "efficiency" if target == "performance" else "performance"
    assert not any(m in text for m in TREE.mains(other))
    assert text.splitlines()[0] == "operation level:"
    assert [line for line in text.splitlines() if not line.startswith("  ")] == [
        "operation level:", "block and connectivity level:", "network level:"]


def test_render_matches_fairnad_layout():
    assert TREE.render("performance").startswith(
        "operation level:\n  feature extraction operators: [attention, mlp, token-mixing-mlp, "
        "grouped convolution, local convolution, convolution, input subtraction pooling, channel-mixing-mlp]\n"
        "  normalization: [grn, batch normalization, layer normalization]\n")
    assert "  dense connectivity for feature reuse: []" in TREE.render("efficiency")


def test_describe():
    text = TREE.describe("performance*block*adaptive feature recalibration*channel attention (SE block)")
    assert text.startswith("adaptive feature recalibration: channel attention (SE block) — squeeze-and-excitation")
    assert text.endswith(")")
    assert TREE.describe(TREE.main_tag("dense connectivity for feature reuse")).startswith(
        "dense connectivity for feature reuse — ")
    assert len({TREE.describe(t) for t in TREE.tags()}) == 56


# --- persistence and validation ------------------------------------------------------------

def test_save_load_round_trip(tmp_path: Path):
    path = tmp_path / "tree" / "attribute_tree.json"
    TREE.save(path)
    assert AttributeTree.load(path) == TREE
    assert AttributeTree.from_dict(TREE.to_dict()) == TREE
    assert [p.name for p in path.parent.iterdir()] == ["attribute_tree.json"]


def _mutated(edit) -> dict:
    d = copy.deepcopy(TREE.to_dict())
    edit(d)
    return d


def _set(path: list, value):
    def edit(d):
        node = d
        for part in path[:-1]:
            node = node[part]
        node[path[-1]] = value
    return edit


@pytest.mark.parametrize("edit, expected", [
    (_set(["targets", "performance", 3, "granularity"], "blok"),
     "attribute_tree.json: targets.performance[3]: unknown granularity 'blok' (valid: operation, block, network)"),
    (_set(["targets", "efficiency", 1, "main"], "normalization"),
     "attribute_tree.json: targets.efficiency[1].main: duplicate main category 'normalization' "
     "(first at targets.performance[1])"),
    (_set(["targets", "performance", 2, "subs", 1, "name"], "SiLU"),
     "attribute_tree.json: targets.performance[2].subs[1].name: duplicate sub-category 'SiLU' under 'activation'"),
    (_set(["targets", "performance", 0, "subs", 0, "description"], None),
     "attribute_tree.json: targets.performance[0].subs[0].description: expected a string, got None"),
    (_set(["targets", "performance", 0, "description"], " "),
     "attribute_tree.json: targets.performance[0].description: expected a non-empty string, got ' '"),
    (_set(["targets", "performance", 0, "subs", 0, "name"], "a*b"),
     "attribute_tree.json: targets.performance[0].subs[0].name: 'a*b' contains '*', the tag separator"),
    (_set(["targets", "performance", 0, "colour"], "red"),
     "attribute_tree.json: targets.performance[0]: unknown key 'colour' "
     "(valid: granularity, main, description, subs)"),
    (_set(["targets", "performance", 0, "subs"], "attention"),
     "attribute_tree.json: targets.performance[0].subs: expected a list, got str"),
    (_set(["targets", "accuracy"], []),
     "attribute_tree.json: targets: unknown target 'accuracy' (valid: performance, efficiency)"),
    (_set(["targets", "efficiency"], []),
     "attribute_tree.json: targets.efficiency: expected a non-empty list of main categories"),
    (_set(["version"], 2), "attribute_tree.json: version: unsupported version 2 (expected 1)"),
    (_set(["source"], 7), "attribute_tree.json: source: expected a string, got 7"),
    (lambda d: d["granularities"].pop("block"), "attribute_tree.json: granularities: missing 'block'"),
    (lambda d: d["targets"]["performance"][4].pop("description"),
     "attribute_tree.json: targets.performance[4]: missing 'description'"),
])
def test_from_dict_errors_name_the_place(edit, expected):
    with pytest.raises(ConfigError) as info:
        AttributeTree.from_dict(_mutated(edit))
    assert str(info.value) == expected


def test_sub_descriptions_may_be_missing_or_empty():
    """Subs an LLM finds in reference models (nas.knowledge.tree_build) come without descriptions."""
    d = TREE.to_dict()
    d["targets"]["performance"][2]["subs"] = [{"name": "mish", "description": ""}, {"name": "elu"}]
    tree = AttributeTree.from_dict(d)
    assert tree.subs("activation") == ["mish", "elu"]
    assert tree.describe("performance*operation*activation*elu") == (
        "activation: elu (the pointwise non-linearity applied after linear layers)")
    assert tree.describe("performance*operation*activation*mish") == tree.describe({
        "target": "performance", "granularity": "operation", "main": "activation", "sub": "MISH"})
    assert AttributeTree.from_dict(tree.to_dict()) == tree


def test_from_dict_rejects_a_non_object():
    with pytest.raises(ConfigError, match=r"^tree\.json: expected an object, got list$"):
        AttributeTree.from_dict([], where="tree.json")


def test_load_errors_name_the_file(tmp_path: Path):
    missing = tmp_path / "nope.json"
    with pytest.raises(ConfigError, match="nope.json: attribute tree file not found"):
        AttributeTree.load(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"version": 1,', encoding="utf-8")
    with pytest.raises(ConfigError, match=r"broken.json: invalid JSON at line 1"):
        AttributeTree.load(broken)
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(_mutated(_set(["targets", "performance", 3, "granularity"], "blok"))),
                   encoding="utf-8")
    with pytest.raises(ConfigError, match=r"bad.json: targets.performance\[3\]: unknown granularity 'blok'"):
        AttributeTree.load(bad)


@pytest.mark.parametrize("call", [lambda: TREE.mains("accuracy"), lambda: TREE.subs("pooling"),
                                  lambda: TREE.render("latency"), lambda: TREE.granularity_display("cell")])
def test_queries_reject_unknown_names(call):
    with pytest.raises(ValueError, match="unknown .*valid: "):
        call()


# --- merge -------------------------------------------------------------------------------

def _llm_tree() -> AttributeTree:
    """A tree as rebuilt by an LLM from reference models: overlaps, new subs, one new main."""
    return AttributeTree.from_dict({
        "version": 1, "source": "llm",
        "granularities": dict(TREE.granularity_names),
        "targets": {
            "performance": [
                {"granularity": "operation", "main": "Activation", "description": "x",
                 "subs": [{"name": "GELU", "description": "dup"}, {"name": "mish", "description": "new"}]},
            ],
            "efficiency": [
                {"granularity": "operation", "main": "efficient convolution", "description": "x",
                 "subs": [{"name": "shift operation", "description": "new"}]},
                {"granularity": "network", "main": "quantisation-aware design", "description": "new main",
                 "subs": [{"name": "low-bit activations", "description": "new"}]},
            ],
        },
    })


def test_a_tree_round_trips_through_its_file_and_dict(tmp_path: Path):
    tree = _llm_tree()
    tree.save(tmp_path / "t.json")
    assert AttributeTree.load(tmp_path / "t.json") == tree
    assert AttributeTree.from_dict(tree.to_dict()) == tree


# --- the built-in corpus -------------------------------------------------------------------

def test_corpus_lines_have_the_schema():
    assert len(CORPUS) >= 40
    assert len({p["title"] for p in CORPUS}) == len(CORPUS)
    for paper in CORPUS:
        assert set(paper) == {"title", "year", "venue", "abstract", "ideas"}, paper["title"]
        assert isinstance(paper["year"], int) and 1990 <= paper["year"] <= 2030, paper["title"]
        assert paper["venue"].strip() and paper["abstract"].strip(), paper["title"]
        assert 1 <= len(paper["ideas"]) <= 3, paper["title"]
        for idea in paper["ideas"]:
            assert set(idea) == {"text", "target", "granularity", "main", "sub"}, paper["title"]


@pytest.mark.parametrize("idea", IDEAS, ids=lambda i: i["text"][:40])
def test_corpus_idea_is_short_and_tagged_canonically(idea):
    assert len(idea["text"].split()) <= IDEA_MAX_WORDS
    tag = Tag(idea["target"], idea["granularity"], idea["main"], idea["sub"])
    assert TREE.check(tag) == tag


def test_corpus_covers_every_main_category():
    per_main = Counter(idea["main"] for idea in IDEAS)
    assert set(per_main) == set(TREE.mains())
    se = [i for i in IDEAS if i["sub"] == "channel attention (SE block)"]
    assert len(se) >= 4
    assert any(i["main"] == "dense connectivity for feature reuse" and i["sub"] == "" for i in IDEAS)
