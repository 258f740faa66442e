"""Every settings mapping, encoding and file that refuses an unknown key does it through one function
(`nas.core.registry.check_keys`), in one line naming where, every unknown key and every valid one."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, Callable

import pytest

from flows.deployments import load
from nas.core.constraint import Constraint
from nas.core.registry import check_keys
from nas.errors import ConfigError, EncodingError
from nas.execute import LocalRunner
from nas.knowledge.config import KnowledgeConfig
from nas.search.screen import ScreenSettings
from nas.spaces.autoformer.arch import AutoFormerArch
from nas.spaces.ofa_mbv3.arch import OFAMbv3Arch
from nas.train.recipe import Recipe

OFA = {"r": [208], "d": [2] * 5, "ks": [3] * 20, "e": [3] * 20}
AUTOFORMER = {"depth": 12, "embed_dim": 192, "heads": [3] * 12, "mlp_ratio": [4.0] * 12}
ENTRY = "flows/entry.py:search_overrides_flow"


def _prefect_yaml(tmp_path: Any, text: str) -> Callable[[], Any]:
    path = tmp_path / "prefect.yaml"
    path.write_text(text)
    return lambda: load(path)


def _local_runner(settings: dict[str, Any]) -> Callable[[], Any]:
    session = SimpleNamespace(search=SimpleNamespace(spec=None, evaluator=None))  # refused before either is used
    return lambda: LocalRunner(settings).run(session, False)  # type: ignore[arg-type]


CASES: list[tuple[str, Callable[[Any], Callable[[], Any]], type[Exception], str]] = [
    ("runner=local", lambda tmp: _local_runner({"name": "local", "worker": 2}), ConfigError,
     "runner=local: unknown key 'worker' (valid: name, workers, per_gpu, max_attempts)"),
    ("screen", lambda tmp: lambda: ScreenSettings.from_config({"factr": 2}), ConfigError,
     "screen: unknown key 'factr' (valid: factor, min_history, params, scorer)"),
    ("constraint", lambda tmp: lambda: Constraint.from_config({"latency": 3, "energy": 1}, "evaluator.budget"),
     ConfigError, "evaluator.budget: unknown keys 'energy', 'latency' (valid: flops, params)"),
    ("ofa_mbv3 encoding", lambda tmp: lambda: OFAMbv3Arch.decode({**OFA, "w": [1]}), EncodingError,
     "ofa_mbv3: unknown key 'w' (valid: r, d, ks, e)"),
    ("autoformer encoding", lambda tmp: lambda: AutoFormerArch.decode({**AUTOFORMER, "extra": 1}), EncodingError,
     "autoformer: unknown field 'extra' (valid: depth, embed_dim, heads, mlp_ratio)"),
    ("prefect.yaml top level", lambda tmp: _prefect_yaml(tmp, "limit: 2\ndeployments: []"), ConfigError,
     "{path}: unknown key 'limit' (valid: name, prefect-version, build, push, pull, deployments, definitions)"),
    ("prefect.yaml deployment", lambda tmp: _prefect_yaml(tmp, f"deployments:\n  - {{name: a, entrypoint: '{ENTRY}', "
                                                               "flow: x}"), ConfigError,
     "deployment 'a': unknown key 'flow' (valid: name, entrypoint, "),
    ("prefect.yaml schedule", lambda tmp: _prefect_yaml(tmp, f"deployments:\n  - {{name: a, entrypoint: '{ENTRY}', "
                                                             "schedules: [{cron: '0 3 * * *', every: 2}]}"),
     ConfigError, "deployment 'a': schedule: unknown key 'every' (valid: cron, timezone, active)"),
    ("recipe", lambda tmp: lambda: Recipe.from_dict({"lr_max": 0.1}), ConfigError, "recipe: unknown key 'lr_max' (valid: "),
    ("knowledge", lambda tmp: lambda: KnowledgeConfig.from_dict({"pth": "x"}), ConfigError,
     "knowledge: unknown key 'pth' (valid: "),
]


@pytest.mark.parametrize("call, error, message", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_an_unknown_key_is_one_line_naming_where_and_the_valid_keys(tmp_path, call, error, message):
    with pytest.raises(error) as info:
        call(tmp_path)()
    text = str(info.value)
    expected = message.format(path=tmp_path / "prefect.yaml")
    assert (text.startswith(expected) if expected.endswith(" ") else text == expected), text
    assert "\n" not in text


def test_check_keys_names_every_unknown_key_in_order_and_takes_any_key_type():
    check_keys("x", {"a": 1}, ("a", "b"))  # no error
    with pytest.raises(ConfigError, match=r"^x: unknown keys '1', 'c' \(valid: b, a\)$"):
        check_keys("x", {"c": 1, 1: 2, "a": 3}, ["b", "a"])
    with pytest.raises(EncodingError, match=r"^y: unknown stage 'z' \(valid: none\)$"):
        check_keys("y", {"z": 1}, [], what="stage", error=EncodingError)
