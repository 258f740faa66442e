"""Knowledge settings: the screen mode `auto` picks, and one-line errors for bad values."""

from __future__ import annotations

import pytest

from nas.errors import ConfigError
from nas.knowledge.config import EMBEDDED_MODEL, KnowledgeConfig
from nas.llm.parse import extract_tagged, find_tagged


@pytest.mark.parametrize("screen,model,mode", [
    ("auto", EMBEDDED_MODEL, "embed"),      # the 135M model answers "no" to every abstract
    ("auto", "gpt-4o-mini", "llm"),
    ("llm", EMBEDDED_MODEL, "llm"),
    ("off", "gpt-4o-mini", "off"),
])
def test_screen_mode(screen, model, mode):
    assert KnowledgeConfig.from_dict({"screen": screen}).screen_mode(model) == mode


@pytest.mark.parametrize("data,message", [
    ({"screen": "maybe"}, "knowledge.screen must be one of auto, llm, embed, off"),
    ({"tagger": "magic"}, "knowledge.tagger must be one of embed, llm"),
    ({"dedup_threshold": 1.5}, "knowledge.dedup_threshold must be in (0, 1]"),
    ({"pth": "x"}, "knowledge: unknown key 'pth'"),
])
def test_bad_settings_are_one_line(data, message):
    with pytest.raises(ConfigError) as err:
        KnowledgeConfig.from_dict(data)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)


def test_missing_tree_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="knowledge.tree: .*nope.json does not exist"):
        KnowledgeConfig.from_dict({"tree": str(tmp_path / "nope.json")}).load_tree()


def test_tags_are_found_in_any_case():
    assert find_tagged("x <TIP>keep shapes</Tip> y", "tip") == "keep shapes"
    assert find_tagged("no tag here", "tip") is None
    assert extract_tagged("<Response> 2, 1 </RESPONSE>", "response") == "2, 1"
