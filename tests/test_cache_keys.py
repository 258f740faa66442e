"""Every cache key and fingerprint in the project, listed in one place (KEYS) and each held to one
property: every input that can change the result, changed alone, changes the key; an input that
cannot (where a file lies, a worker count, a time limit, a cache size) leaves it equal.

`test_every_key_in_the_code_is_listed` scans nas/, tasks/, flows/ and supernets/ for what makes a
key (a hash, a uuid5, a Prefect cache policy or key function, a keyed file store, a `fingerprint` or
`identity` method, a function named *_key, an in-process memo written by key, an lru_cache): each
site is in KEYS with the tests that vary its inputs, or in NOT_KEYS saying why it keys no result, so
a key added without its test fails here."""

from __future__ import annotations

import ast
import copy
import dataclasses
import gzip
import hashlib
import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from nas.core.arch import Architecture, stable_hash
from nas.core.constraint import Constraint
from nas.search.spec import Component, SearchSpec

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("nas", "tasks", "flows", "supernets")

# "file:qualname" of each key or fingerprint → the tests that vary its inputs ("name" is in this
# module, "tests/<file>::name" in another one).
KEYS: dict[str, tuple[str, ...]] = {
    # LLM replies: the reply cache, the Prefect task of each call, the prompt's version in the key
    "nas/llm/cache.py:call_key": ("test_llm_reply_key_follows_each_input_of_the_call",
                                  "test_llm_reply_key_ignores_where_and_how_long",
                                  "test_llm_model_file_names_the_key"),
    "nas/llm/cache.py:ReplyCache": ("test_llm_cache_off_neither_reads_nor_writes_the_reply_cache",
                                    "tests/test_cache_safety.py::test_llm_reply_cache_file_of_the_wrong_shape_is_a_miss"),
    "nas/llm/prompts.py:parse_prompt": ("test_llm_prompt_text_names_the_template",
                                        "tests/test_llm_client.py::test_prompt_edit_changes_the_key"),
    "tasks/llm.py:cache_key": ("test_llm_task_key_is_the_call_key",),
    "tasks/llm.py:llm_call": (
        "test_llm_task_key_is_the_call_key",
        "tests/test_strategy_mutants.py::"
        "test_llm_calls_as_prefect_tasks_cache_hits_say_so_and_uncached_calls_leave_nothing",
        "tests/test_strategy_mutants.py::test_an_llm_calls_task_reads_and_keeps_replies_only_when_cached"),
    # evaluations: evaluator fingerprints, the Prefect task cache, in-process memos
    "nas/evaluators/base.py:Evaluator.fingerprint": ("test_every_evaluator_fingerprint_is_tested_here",),
    "nas/evaluators/table.py:TableEvaluator.fingerprint": ("test_table_fingerprint",),
    "nas/core/space.py:Benchmark.fingerprint": ("test_table_fingerprint",),
    "nas/spaces/nb201/table.py:NB201Table.fingerprint": ("test_table_fingerprint",),
    "nas/spaces/nb201/table.py:_sha256": ("test_table_fingerprint",),
    "nas/spaces/nb201/table.py:_load_table": ("test_table_fingerprint", "test_derived_table_is_read_back_for_the_same_bytes_only"),
    # the warm `nas search` process: which commands it may run as a fresh process would
    "nas/cli/warm.py:fingerprint": ("tests/test_warm.py::test_the_fingerprint_follows_each_input_alone",
                                    "tests/test_warm.py::test_the_fingerprint_ignores_shell_state_caches_and_the_working_directory",
                                    "tests/test_warm.py::test_an_installed_package_changes_the_fingerprint"),
    "nas/cli/warm.py:address": ("tests/test_warm.py::test_the_address_follows_home_and_fingerprint",),
    "nas/spaces/nb201/table.py:derived_table_key": ("test_derived_table_key_follows_each_input",
                                                    "test_derived_table_is_read_back_for_the_same_bytes_only"),
    "nas/evaluators/simulated.py:SimulatedEvaluator.fingerprint": ("test_simulated_fingerprint",),
    "nas/evaluators/simulated.py:SimulatedEvaluator.duration": ("test_simulated_fingerprint",),
    "nas/evaluators/proxy.py:ProxyEvaluator.fingerprint": ("test_proxy_fingerprint",),
    "nas/evaluators/proxy.py:ProxyEvaluator.reference_scores": ("test_proxy_reference_sample_is_kept_per_settings",),
    "nas/evaluators/train.py:TrainEvaluator.fingerprint": ("test_train_fingerprint",),
    "supernets/evaluator.py:SupernetEvaluator.__init__": ("test_supernet_fingerprint",),
    "supernets/evaluator.py:SupernetEvaluator.fingerprint": ("test_supernet_fingerprint",),
    "supernets/evaluator.py:SupernetEvaluator.evaluate": ("test_supernet_scores_memo_is_per_fingerprint",),
    "supernets/checkpoints.py:load_checkpoint": ("test_supernet_fingerprint",
                                                 "test_supernet_checkpoint_sha256_is_of_the_file_written"),
    "nas/data/imagenet.py:ImageFolderData.identity": (
        "tests/test_data_imagenet.py::test_each_score_input_alone_changes_the_fingerprint",
        "tests/test_data_imagenet.py::test_the_listing_changes_the_fingerprint_and_the_place_does_not"),
    "tasks/evaluate.py:evaluate_task": ("test_evaluation_task_key_follows_each_input",
                                        "test_evaluation_cache_is_read_only_when_cached"),
    "tasks/evaluate.py:cache_key": ("test_evaluation_task_key_follows_each_input",),
    "tasks/evaluate.py:_built": ("test_evaluation_task_builds_one_evaluator_per_config",),
    # supernet training: the checkpoint's hash and the flow's cache
    "supernets/train.py:train_supernet": ("test_supernet_checkpoint_sha256_is_of_the_file_written",),
    "flows/supernet.py:train_supernet_task": ("test_supernet_flow_key_follows_each_input",),
    "flows/supernet.py:_must_retrain": ("test_supernet_flow_cache_is_refused_for_a_checkpoint_changed_in_place",
                                        "test_supernet_flow_key_follows_each_input"),
    "flows/supernet.py:fingerprint_data": ("test_supernet_flow_data_fingerprint_follows_the_images_not_the_place",),
    # kept sandbox verdicts (their key function; the sandbox's own graph hash is the sandbox's)
    "nas/design/verdicts.py:verdict_key": ("test_verdict_key_follows_each_limit",
                                           "tests/test_design_verifiers.py::test_key_covers_everything_a_verdict_depends_on"),
    "nas/design/verdicts.py:checker_fingerprint": (
        "tests/test_design_verifiers.py::test_checker_fingerprint_follows_the_sandbox_code",),
    "nas/design/verdicts.py:VerdictCache": (
        "tests/test_design_verifiers.py::test_damaged_kept_verdict_is_ignored_with_a_warning",),
    "nas/sandbox/graph.py:graph_hash": ("tests/test_trusted_worker.py::test_a_kept_verdict_vouches_for_no_other_graph",
                                        "tests/test_trusted_side.py::test_a_childs_graph_hash_is_never_kept"),
    # knowledge records
    "nas/knowledge/idea.py:Idea.id": ("test_knowledge_record_ids",),
    "nas/knowledge/store.py:Experience.id": ("test_knowledge_record_ids",
                                             "tests/test_case_tables.py::"
                                             "test_experiences_are_one_record_only_with_the_same_kind_and_text"),
    "nas/knowledge/store.py:KnowledgeStore.paper_id": ("test_knowledge_record_ids",),
    "nas/knowledge/papers.py:Paper.hash": ("test_paper_hash_follows_the_content_not_the_file",),
    # compare groups, run identities, architectures
    "nas/compare.py:run_setting": ("test_compare_setting_follows_each_result_input",),
    "nas/compare.py:strategy_settings": ("test_compare_group_label_follows_the_strategy_settings",),
    "nas/search/spec.py:SearchSpec.identity": ("test_search_identity_follows_each_field_but_the_budget",),
    "nas/search/rundir.py:RunDir.prepare": ("test_resume_accepts_result_neutral_changes_only",),
    "nas/search/rundir.py:RunDir.save_state": ("test_resume_accepts_result_neutral_changes_only",),
    "nas/core/arch.py:stable_hash": ("test_stable_hash_is_of_every_part",),
    "nas/core/arch.py:Architecture.key": ("test_architecture_key_holds_the_space_and_the_canonical_form",
                                          "tests/test_space_contract.py::test_keys_are_stable_across_processes"),
    "nas/spaces/nader/arch.py:BlockArch.section_keys": ("test_nader_section_keys_are_per_role",),
    "nas/spaces/nader/dag/canon.py:block_key": (
        "tests/test_dag_canon.py::test_key_invariant_under_renumbering_and_shuffling",
        "tests/test_dag_canon.py::test_argument_change_changes_key_and_kwarg_order_does_not"),
    "nas/data/sources.py:load_data": ("test_supernet_flow_data_fingerprint_follows_the_images_not_the_place",),
}

# Keys made of fields rather than hashed, which the scan cannot see: listed by hand.
BY_HAND = {"nas/compare.py:run_setting", "nas/compare.py:strategy_settings"}

# Sites the scan finds that key no result, and why.
NOT_KEYS: dict[str, str] = {
    "nas/export/run.py:_sha256": "export's manifest records each written file's sha256: a record, not a key",
    "nas/spaces/source/arch.py:SourceArch.__repr__": "a short hash in a repr, for people",
    "nas/cli/arch.py:show_model": "`nas arch show` prints Architecture.key's key",
    "flows/artifacts.py:artifact_key": "a Prefect artifact's name, not a cache",
    "tasks/progress.py:artifact_key": "a Prefect artifact's name, not a cache",
    "tasks/progress.py:prefect_key": "a Prefect artifact's name, not a cache",
    "nas/agents/nader/modtree.py:ModificationTree.has_key": "a look-up by Architecture.key's key",
    "nas/core/arch.py:SeenIndex.add_key": "records Architecture.key's key",
    "nas/config.py:check_key": "checks an override's name",
    "nas/knowledge/tree.py:_key": "compares tag names (case and spacing)",
    "nas/knowledge/store.py:_key": "an open Qdrant client by its location: a handle, not a result",
    "nas/knowledge/store.py:open_client": "open Qdrant clients by location: handles, not results",
    "nas/knowledge/store.py:using": "open Qdrant clients by location: handles, not results",
    "nas/knowledge/store.py:_close_later": "idle timers of open clients",
    "nas/knowledge/store.py:_blas": "the BLAS thread controller, one per process",
    "nas/knowledge/minilm.py:_blas": "the BLAS thread controller, one per process",
    "nas/knowledge/embed.py:default_embedder": "the bundled embedding model, loaded once per process",
    "nas/knowledge/tree.py:_builtin": "the shipped attribute tree, parsed once per process",
    "nas/llm/local.py:_settings_key": "the running llama.cpp server by all its settings: a process, not a result",
    "nas/llm/local.py:shared_server": "the running llama.cpp server by all its settings: a process, not a result",
    "nas/llm/prompts.py:load_prompt": "a prompt by name, parsed once (its text's hash is in the template id)",
    "nas/llm/prompts.py:packaged_prompts": "the packaged prompt files, listed once",
    "nas/spaces/nader/dag/ops.py:register.deco": "the operator registry",
    "nas/spaces/nader/dag/expr.py:parse_expr": "a pure function of its one argument, memoised",
    "nas/spaces/nader/dag/macro.py:search_width.anchor": "a pure function of its argument within one call",
    "nas/spaces/nb201/cost.py:cost_model": "a pure function of its arguments, memoised",
    "nas/spaces/spos/space.py:cost_table": "a pure function of its arguments, memoised",
    "nas/train/fast.py:_resident": "data already on a device, by tensor identity",
    "supernets/released/__init__.py:register": "the released-checkpoint format registry",
    "nas/core/registry.py:plugins": "entry points installed in this environment, read once",
    "nas/core/registry.py:_entry_points": "entry points installed in this environment, read once",
    "nas/config.py:default_groups": "the packaged config tree's groups, read once",
    "nas/config.py:group_dirs": "the packaged config tree's groups, read once",
    "nas/data/imagenet.py:scan": "a folder's listing, once per process and root (its identity is ImageFolderData.identity)",
    "nas/sandbox/isolation.py:isolation": "the OS isolation available, probed once per process",
    "nas/sandbox/graph.py:_argument_names": "an aten operator's schema, by name",
    "nas/sandbox/graph.py:_aten": "an aten operator, by name",
    "nas/sandbox/verify.py:_on_one_device": "a warning said once per process",
}

HASH_CALLS = {"stable_hash", "sha256", "sha1", "md5", "blake2b", "uuid5", "compute_key", "crc32"}
MEMO_DECORATORS = {"cache", "lru_cache"}


def _module_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in tree.body:
        targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) \
            else []
        names |= {t.id for t in targets if isinstance(t, ast.Name)}
    return names


def _is_memo(deco: ast.expr) -> bool:
    target = deco.func if isinstance(deco, ast.Call) else deco
    return (getattr(target, "attr", None) or getattr(target, "id", None)) in MEMO_DECORATORS


def _sites_in(node: ast.AST, stack: list[str], rel: str, module_names: set[str], sites: set[str]) -> None:
    for child in ast.iter_child_nodes(node):
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            name = f"{rel}:{'.'.join([*stack, child.name])}"
            if isinstance(child, ast.ClassDef):
                if any(getattr(b, "id", None) == "KeyedFiles" for b in child.bases):
                    sites.add(name)
            elif child.name in ("fingerprint", "identity") or child.name.endswith("_key") \
                    or any(map(_is_memo, child.decorator_list)):
                sites.add(name)
            _sites_in(child, [*stack, child.name], rel, module_names, sites)
            continue
        site = f"{rel}:{'.'.join(stack) or '<module>'}"
        if isinstance(child, ast.Call):
            func = child.func
            if (func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")) in HASH_CALLS:
                sites.add(site)
            if any(kw.arg in ("cache_policy", "cache_key_fn") and getattr(kw.value, "id", "") != "NO_CACHE"
                   for kw in child.keywords):
                sites.add(site)
        if isinstance(child, ast.Assign) and stack and any(
                isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name) and t.value.id in module_names
                for t in child.targets):
            sites.add(site)  # a module-level memo written by key
        _sites_in(child, stack, rel, module_names, sites)


def key_sites() -> set[str]:
    """'file:qualname' of every place that makes a key, by the rules in the module's docstring."""
    sites: set[str] = set()
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            _sites_in(tree, [], path.relative_to(ROOT).as_posix(), _module_names(tree), sites)
    return sites


def test_every_key_in_the_code_is_listed():
    found = key_sites()
    unlisted = sorted(found - set(KEYS) - set(NOT_KEYS))
    assert not unlisted, f"new keys: add each to KEYS (with tests that vary its inputs) or NOT_KEYS: {unlisted}"
    stale = sorted((set(KEYS) | set(NOT_KEYS)) - found - BY_HAND)
    assert not stale, f"listed but no longer in the code: {stale}"
    assert not set(KEYS) & set(NOT_KEYS)
    for site in BY_HAND:
        file, _, name = site.partition(":")
        assert name in _defined(ROOT / file), f"{site}: no such function"


def _defined(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text(encoding="utf-8")).body if isinstance(n, ast.FunctionDef)}


def _defined_tests(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    return {n.name for n in tree.body if isinstance(n, ast.FunctionDef) and n.name.startswith("test")}


def test_every_listed_key_names_tests_that_exist():
    here = _defined_tests(Path(__file__))
    missing = []
    for site, tests in KEYS.items():
        assert tests, f"{site}: no tests"
        for test in tests:
            file, _, name = test.rpartition("::")
            defined = _defined_tests(ROOT / file) if file else here
            if name not in defined:
                missing.append(f"{site}: {test}")
    assert not missing


def test_stable_hash_is_of_every_part():
    assert stable_hash("a", 1) != stable_hash("a", 2) != stable_hash("b", 2)
    assert stable_hash({"x": 1, "y": 2}) == stable_hash({"y": 2, "x": 1})  # dict order is no input
    assert stable_hash("ab") != stable_hash("a", "b") and len(stable_hash("a", length=32)) == 32


# --- LLM replies ---------------------------------------------------------------------------------------

REPLY = {"reply": "ok", "finish_reason": "stop", "prompt_tokens": 1, "completion_tokens": 1, "latency_s": 0.0}
LLM = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
       "structured": "none", "cache": False}
MESSAGES = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "u"}]
CALL: dict[str, Any] = {"role": "proposer", "messages": MESSAGES, "template": "t@1", "grammar": None, "schema": None,
                        "attempt": 0}


def reply_key(config: dict[str, Any] | None = None, **call: Any) -> str:
    """The key `LLMClient.complete` gives a call (its `calls` hook sees it; nothing is sent)."""
    from nas.llm import LLMClient

    keys: list[str] = []

    def calls(role, key, fetch, cached):
        keys.append(key)
        return dict(REPLY), 0, "live"

    LLMClient({**LLM, **(config or {})}, calls=calls).complete(**{**CALL, **call})
    return keys[0]


@pytest.fixture(autouse=True)
def api_key(monkeypatch):
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-cache-keys")


CALL_CHANGES = {
    "model": ({"model": "m2"}, {}),
    "the role's model": ({"roles": {"proposer": {"model": "m2"}}}, {}),
    "the role's temperature": ({"roles": {"proposer": {"temperature": 0.3}}}, {}),
    "the role's max_tokens": ({"roles": {"proposer": {"max_tokens": 77}}}, {}),
    "the call's temperature": ({}, {"temperature": 0.3}),
    "the call's max_tokens": ({}, {"max_tokens": 77}),
    "a message's text": ({}, {"messages": [MESSAGES[0], {"role": "user", "content": "v"}]}),
    "the system message": ({}, {"messages": [{"role": "system", "content": "be long"}, MESSAGES[1]]}),
    "a message's role": ({}, {"messages": [MESSAGES[0], {"role": "assistant", "content": "u"}]}),
    "one more message": ({}, {"messages": [*MESSAGES, {"role": "user", "content": "u"}]}),
    "the template": ({}, {"template": "t@2"}),
    "the grammar": ({}, {"grammar": "root ::= \"a\""}),
    "the schema": ({}, {"schema": {"type": "object"}}),
    "the attempt": ({}, {"attempt": 1}),
}


@pytest.mark.parametrize("change", CALL_CHANGES)
def test_llm_reply_key_follows_each_input_of_the_call(change):
    config, call = CALL_CHANGES[change]
    assert reply_key(config, **call) != reply_key(), change


LLM_NEUTRAL = {
    "where the cache is": {"cache_dir": "/elsewhere"}, "the cache switch": {"cache": True},
    "the endpoint's address": {"base_url": "http://127.0.0.1:10/v1"}, "the timeout": {"timeout_s": 3.0},
    "the retries": {"max_retries": 9}, "the backoff": {"backoff_s": 2.0, "backoff_max_s": 3.0},
    "the key's variable": {"api_key_env": "NASFLOW_OTHER_KEY"}, "the context window": {"context": 999},
}


@pytest.mark.parametrize("change", LLM_NEUTRAL)
def test_llm_reply_key_ignores_where_and_how_long(change, monkeypatch, tmp_path):
    monkeypatch.setenv("NASFLOW_OTHER_KEY", "sk-test-another-key")
    config = {k: (str(tmp_path) if k == "cache_dir" else v) for k, v in LLM_NEUTRAL[change].items()}
    assert reply_key(config) == reply_key(), change


def test_llm_reply_key_never_holds_the_api_key(monkeypatch):
    first = reply_key()
    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test-rotated-key")
    assert reply_key() == first


STRUCTURED_SENT = {  # (config, call) -> a grammar or schema reaches the endpoint
    "grammar to llama.cpp": ({"structured": "grammar"}, {"grammar": 'root ::= "a"'}),
    "schema as json_schema": ({"structured": "json_schema"}, {"schema": {"type": "object"}}),
    "schema to llama.cpp": ({"structured": "grammar"}, {"schema": {"type": "object"}}),
}


@pytest.mark.parametrize("case", STRUCTURED_SENT)
def test_llm_reply_key_follows_what_is_sent_to_constrain_the_reply(case):
    """The same grammar or schema sent, or left out by `llm.structured=none`: two different calls."""
    config, call = STRUCTURED_SENT[case]
    assert reply_key(config, **call) != reply_key({"structured": "none"}, **call), case


def test_llm_reply_key_ignores_a_mode_that_sends_nothing():
    """No grammar or schema in the call: the mode changes nothing sent, so nothing in the key."""
    assert reply_key({"structured": "grammar"}) == reply_key({"structured": "none"}) == \
        reply_key({"structured": "json_schema"})
    # json_schema mode drops a grammar (OpenAI takes none): the same as sending nothing.
    grammar = {"grammar": 'root ::= "a"'}
    assert reply_key({"structured": "json_schema"}, **grammar) == reply_key({"structured": "none"}, **grammar)


def test_llm_model_file_names_the_key(tmp_path):
    """A chosen GGUF file: its name and size are in the key (not its folder)."""
    from nas.llm.config import LLMConfig

    def model_id(path: Path, size: int) -> str:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(b"GGUF" + bytes(size - 4))
        return LLMConfig.from_dict({"backend": "local", "model": "m", "model_path": str(path)}).model_id("m")

    base = model_id(tmp_path / "a" / "q4.gguf", 64)
    assert model_id(tmp_path / "b" / "q4.gguf", 64) == base           # moved
    assert model_id(tmp_path / "a" / "q8.gguf", 64) != base           # another file
    assert model_id(tmp_path / "c" / "q4.gguf", 65) != base           # another size
    other = model_id(tmp_path / "a" / "q8.gguf", 64)
    assert reply_key({"backend": "local", "model_path": str(tmp_path / "a" / "q4.gguf")}) != \
        reply_key({"backend": "local", "model_path": str(tmp_path / "a" / "q8.gguf")}), other


def test_llm_cache_off_neither_reads_nor_writes_the_reply_cache(tmp_path):
    """`llm.cache=false`: a reply kept under the call's key is not served, and nothing is kept."""
    from nas.llm import LLMClient
    from nas.llm.cache import ReplyCache
    from support.scripted import ScriptedServer

    with ScriptedServer(["live one", "live two"]) as srv:
        cfg = {**LLM, "base_url": srv.base_url, "cache_dir": str(tmp_path / "cache"), "max_retries": 0}
        key = LLMClient({**cfg, "cache": True}).complete(**CALL).key        # kept
        cache = ReplyCache(tmp_path / "cache")
        kept = cache.get(key)
        cache.put({**kept, "reply": "from the cache"})
        reply = LLMClient({**cfg, "cache": False}).complete(**CALL)
        assert reply.text == "live two" and reply.source == "live" and len(srv.requests) == 2
        assert cache.get(key)["reply"] == "from the cache"                  # not rewritten either
        again = LLMClient({**cfg, "cache": True}).complete(**CALL)
    assert again.source == "cache" and again.text == "from the cache" and len(srv.requests) == 2


def test_llm_prompt_text_names_the_template():
    from nas.llm.prompts import parse_prompt

    def template(body: str, version: int = 1, name: str = "t") -> str:
        return parse_prompt(f"---\nname: {name}\nversion: {version}\nrole: reader\n---\n[user]\n{body}\n", "p.md").template_id

    base = template("A {{x}}")
    assert template("A {{x}}") == base
    assert len({base, template("B {{x}}"), template("A {{x}}", version=2), template("A {{x}}", name="u")}) == 4


def test_a_prompt_parsed_once_and_shared_cannot_be_edited_in_place():
    """`load_prompt` hands every caller the same parsed prompt: one that edited its text would change
    every later call's prompt while its template id (the cache key's part) still named the old text."""
    from nas.llm.prompts import load_prompt, packaged_prompts

    name = sorted(packaged_prompts())[0]
    prompt = load_prompt(name)
    assert load_prompt(name) is prompt
    with pytest.raises(dataclasses.FrozenInstanceError):
        prompt.user = "something else"  # type: ignore[misc]
    assert {prompt: 1}[load_prompt(name)] == 1  # hashable by value: usable as a key


def test_llm_task_key_is_the_call_key():
    """The Prefect task of a call is cached by the call's key alone: its role and its fetch are no input."""
    from tasks.llm import cache_key, llm_call

    def key(**params: Any) -> str:
        return llm_call.cache_key_fn(None, {"role": "proposer", "key": "k1", "fetch": print, **params})

    assert key() == cache_key("k1") and key(key="k2") == cache_key("k2") != key()
    assert key(role="modifier") == key(fetch=len) == key()


# --- evaluator fingerprints ----------------------------------------------------------------------------

DIGITS = {"name": "digits", "root": None, "split_file": None}


def make_evaluator(name: str, space: str = "nb201", space_params: dict[str, Any] | None = None, **params: Any):
    from nas.search.spec import build_evaluator
    from nas.spaces import SPACES

    return build_evaluator(Component(name, params), SPACES.create(space, space_params or {}))


def test_every_evaluator_fingerprint_is_tested_here():
    from nas.evaluators import EVALUATORS

    assert set(EVALUATORS.names()) == {"table", "simulated", "proxy", "train", "supernet"}


@pytest.fixture(scope="module")
def table_copy(tmp_path_factory) -> Path:
    from nas.spaces.nb201.table import default_table_path

    path = tmp_path_factory.mktemp("table") / "copy.anb"
    shutil.copyfile(default_table_path(), path)
    return path


def test_table_fingerprint(table_copy, tmp_path):
    base = make_evaluator("table").fingerprint()
    assert make_evaluator("table", path=str(table_copy)).fingerprint() == base                    # moved
    assert make_evaluator("table", simulated_cost_seconds=0.001).fingerprint() == base            # a sleep
    changed = [make_evaluator("table", metric="qat_accuracy"), make_evaluator("table", num_classes=100),
               make_evaluator("table", resolution=64)]
    assert len({base, *(e.fingerprint() for e in changed)}) == 4
    edited = tmp_path / "edited.anb"
    shutil.copyfile(table_copy, edited)
    evaluator = make_evaluator("table", path=str(edited))
    before = evaluator.fingerprint()
    with edited.open("ab") as fh:  # changed in place (the table reads the same: pickle stops at its end)
        fh.write(b"\0")
    assert evaluator.fingerprint() != before


def test_derived_table_key_follows_each_input(monkeypatch):
    from nas.spaces.nb201 import table

    base = table.derived_table_key("a" * 64, "baseline_accuracy")
    assert table.derived_table_key("b" + "a" * 63, "baseline_accuracy") != base  # other bytes
    assert table.derived_table_key("a" * 64, "qat_accuracy") != base  # another metric
    monkeypatch.setattr(table, "DERIVED_FORMAT", table.DERIVED_FORMAT + 1)
    assert table.derived_table_key("a" * 64, "baseline_accuracy") != base  # another layout


def _derived_files(home: Path) -> list[Path]:
    return sorted((home / "tables" / "nb201").glob("*.npz"))


def test_derived_table_is_read_back_for_the_same_bytes_only(table_copy, tmp_path, monkeypatch):
    """The first read writes the derived file; the next read takes its values (a value changed in it
    shows); the table changed in place is read from its pickle again, under a new derived file."""
    from nas.spaces.nb201.table import _load_table, load_table

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    edited = tmp_path / "edited.anb"
    shutil.copyfile(table_copy, edited)
    _load_table.cache_clear()
    first = load_table(str(edited), "baseline_accuracy")
    [derived] = _derived_files(tmp_path / "home")
    with np.load(derived) as npz:
        keys, values = npz["keys"], npz["values"]
    assert dict(zip(map(tuple, keys.tolist()), values.tolist())) == first
    values = values.copy()
    values[0] = 12.5
    with derived.open("wb") as fh:
        np.savez(fh, keys=keys, values=values)
    _load_table.cache_clear()
    assert load_table(str(edited), "baseline_accuracy")[tuple(keys[0].tolist())] == 12.5  # read from the file
    with edited.open("ab") as fh:  # changed in place: other bytes, the same table
        fh.write(b"\0")
    _load_table.cache_clear()
    assert load_table(str(edited), "baseline_accuracy") == first
    assert len(_derived_files(tmp_path / "home")) == 2
    _load_table.cache_clear()


def _npz(**arrays: Any) -> bytes:
    import io

    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


CELLS = 5 ** 6
BAD_DERIVED = {
    "not a zip": lambda k, v: b"garbage",
    "truncated": lambda k, v: _npz(keys=k, values=v)[:1000],
    "no values": lambda k, v: _npz(keys=k),
    "one cell short": lambda k, v: _npz(keys=k[1:], values=v[1:]),
    "keys as int64": lambda k, v: _npz(keys=k.astype(np.int64), values=v),
    "values as float32": lambda k, v: _npz(keys=k, values=v.astype(np.float32)),
    "an op index past the last op": lambda k, v: _npz(keys=np.where(k == 4, 5, k).astype(np.uint8), values=v),
    "a cell twice": lambda k, v: _npz(keys=np.concatenate([k[:1], k[:-1]]), values=v),
    "pickled objects": lambda k, v: _npz(keys=np.array([object()] * CELLS, dtype=object), values=v),
}


@pytest.mark.parametrize("case", list(BAD_DERIVED))
def test_a_derived_table_that_is_not_whole_is_read_from_the_pickle_again(case, table_copy, tmp_path, monkeypatch):
    from nas.spaces.nb201.table import _load_table, load_table

    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path / "home"))
    _load_table.cache_clear()
    truth = load_table(str(table_copy), "baseline_accuracy")
    [derived] = _derived_files(tmp_path / "home")
    with np.load(derived) as npz:
        keys, values = npz["keys"], npz["values"]
    derived.write_bytes(BAD_DERIVED[case](keys, values))
    _load_table.cache_clear()
    assert load_table(str(table_copy), "baseline_accuracy") == truth
    with np.load(derived) as npz:  # written whole again
        assert npz["keys"].shape == (CELLS, 6)
    _load_table.cache_clear()


def test_a_read_only_home_still_reads_the_table(table_copy, tmp_path, monkeypatch):
    from nas.spaces.nb201.table import _load_table, load_table

    blocker = tmp_path / "home"
    blocker.write_text("a file where the home's folders would go")
    monkeypatch.setenv("NASFLOW_HOME", str(blocker))
    _load_table.cache_clear()
    assert len(load_table(str(table_copy), "baseline_accuracy")) == CELLS
    _load_table.cache_clear()


def test_simulated_fingerprint():
    base_params = {"median_seconds": 0.01, "sigma": 0.1}
    base = make_evaluator("simulated", **base_params)
    for change in ({"distribution": "pareto"}, {"median_seconds": 0.02}, {"sigma": 0.2}, {"pareto_alpha": 2.0},
                   {"seed": 1}, {"metric": "qat_accuracy"}):
        assert make_evaluator("simulated", **{**base_params, **change}).fingerprint() != base.fingerprint(), change
    assert make_evaluator("simulated", **base_params, time_scale=0.5).fingerprint() == base.fingerprint()
    arch = base.space.sample(np.random.default_rng(0))
    assert make_evaluator("simulated", **base_params, seed=1).duration(arch) != base.duration(arch)  # a real input


PROXY = {"data": DIGITS, "batch_size": 8, "reference": 3, "channels": 4, "cells_per_stage": 1}


def test_proxy_fingerprint():
    base = make_evaluator("proxy", **PROXY).fingerprint()
    for change in ({"proxies": ["synflow"]}, {"batch_size": 4}, {"reference": 4}, {"seed": 1}, {"channels": 8},
                   {"cells_per_stage": 2}):
        assert make_evaluator("proxy", **{**PROXY, **change}).fingerprint() != base, change


def test_proxy_reference_sample_is_kept_per_settings(tmp_path, monkeypatch):
    monkeypatch.setenv("NASFLOW_HOME", str(tmp_path))
    folder = tmp_path / "proxy_reference"
    make_evaluator("proxy", **PROXY, proxies=["synflow"]).reference_scores()
    first = set(folder.iterdir())
    make_evaluator("proxy", **PROXY, proxies=["synflow"]).reference_scores()   # the same settings: read
    assert set(folder.iterdir()) == first and len(first) == 1
    make_evaluator("proxy", **{**PROXY, "batch_size": 4}, proxies=["synflow"]).reference_scores()  # same cells
    assert len(set(folder.iterdir())) == 2
    make_evaluator("proxy", **PROXY, proxies=["synflow"], seed=1).reference_scores()             # other cells
    assert len(set(folder.iterdir())) == 3


def _other(value: Any) -> Any:
    """A valid different value of a recipe/engine field."""
    if isinstance(value, bool):
        return not value
    if value is None:
        return 7
    if isinstance(value, int):
        return value + 1
    if isinstance(value, float):
        return value / 2
    return {"plain": "fast", "cpu": "gpu", "auto": "off"}[value]


def test_train_fingerprint():
    from nas.train.engine import Engine
    from nas.train.recipe import Recipe

    params = {"data": DIGITS, "recipe": {"epochs": 1, "batch_size": 64}, "seeds": [0], "channels": 4,
              "cells_per_stage": 1}
    base = make_evaluator("train", **params).fingerprint()
    recipe = Recipe.from_dict(params["recipe"]).to_dict()
    for field in recipe:
        changed = {**params, "recipe": {**recipe, field: _other(recipe[field])}}
        assert make_evaluator("train", **changed).fingerprint() != base, f"recipe.{field}"
    fast = {"kind": "fast"}
    assert make_evaluator("train", **params, engine=fast).fingerprint() != base
    fast_base = make_evaluator("train", **params, engine=fast).fingerprint()
    for field, value in Engine(kind="fast").to_dict().items():
        if field in ("kind", "devices"):
            continue
        changed_engine = {**fast, field: _other(value)}
        assert make_evaluator("train", **params, engine=changed_engine).fingerprint() != fast_base, f"engine.{field}"
    for change in ({"seeds": [1]}, {"seeds": [0, 1]}, {"channels": 8}, {"cells_per_stage": 2}, {"data": DIGITS | {
            "split_file": None, "name": "digits", "root": "/some/where/else"}}):
        assert make_evaluator("train", **{**params, **change}).fingerprint() != base, change
    # what changes no result: whether self-reported numbers may rank, the extra proxy metrics, the sandbox limits
    for change in ({"trust_self_reported": True}, {"proxies": []}, {"sandbox": {"wall_s": 10.0}}):
        assert make_evaluator("train", **{**params, **change}).fingerprint() == base, change


@pytest.fixture(scope="module")
def supernet_file(tmp_path_factory) -> Path:
    """A supernet of the `_small` AutoFormer preset trained one epoch on 64 digits (about a second)."""
    from conftest import space_preset
    from supernets.train import SupernetSettings, train_supernet

    params = space_preset("autoformer_small")
    settings = SupernetSettings(epochs=1, batch_size=64, train_subset=64, val_subset=50, recal_batches=1)
    return train_supernet(params, {}, dict(DIGITS), settings, seed=0,
                          out_dir=tmp_path_factory.mktemp("supernet"), progress=False).path


def supernet_evaluator(path: Path, **params: Any):
    from conftest import space_preset

    space = space_preset("autoformer_small")
    name = space.pop("name")
    return make_evaluator("supernet", name, space, checkpoint=str(path),
                          **{"recal_batches": 1, "batch_size": 64, "val_subset": 50, **params})


def test_supernet_fingerprint(supernet_file, tmp_path):
    """The weights it scores with (the file's bytes), the data and the scoring settings; not where the
    file lies nor the device."""
    import torch

    base = supernet_evaluator(supernet_file).fingerprint()
    moved = tmp_path / "moved" / "supernet.pt"
    moved.parent.mkdir()
    shutil.copyfile(supernet_file, moved)
    assert supernet_evaluator(moved).fingerprint() == base
    assert supernet_evaluator(supernet_file, device="cpu").fingerprint() == base
    assert supernet_evaluator(supernet_file, data=DIGITS).fingerprint() == base   # the checkpoint's own data
    for change in ({"recal_batches": 2}, {"batch_size": 32}, {"val_subset": 40}):
        assert supernet_evaluator(supernet_file, **change).fingerprint() != base, change
    record = torch.load(supernet_file, map_location="cpu", weights_only=False)
    name, tensor = next((k, v) for k, v in record["state_dict"].items() if v.is_floating_point() and v.numel())
    record["state_dict"][name] = tensor + 1e-3                     # one weight tensor changed, nothing else
    other = tmp_path / "other" / "supernet.pt"
    other.parent.mkdir()
    torch.save(record, other)
    assert supernet_evaluator(other).fingerprint() != base


def test_supernet_scores_memo_is_per_fingerprint(supernet_file, monkeypatch):
    from supernets import evaluator as module

    monkeypatch.setattr(module, "SCORES", {})
    a, b = supernet_evaluator(supernet_file), supernet_evaluator(supernet_file, recal_batches=2)
    arch = a.space.sample(np.random.default_rng(0))
    a.evaluate(arch)
    b.evaluate(arch)
    twin = supernet_evaluator(supernet_file)
    twin.evaluate(arch)
    assert (a.computed, b.computed, twin.computed) == (1, 1, 0)


def test_supernet_checkpoint_sha256_is_of_the_file_written(supernet_file):
    from supernets.checkpoints import load_checkpoint

    raw = supernet_file.read_bytes()
    sidecar = json.loads(supernet_file.with_suffix(".json").read_text())
    sha, _ = load_checkpoint(supernet_file, "autoformer")
    assert sha == sidecar["sha256"] == hashlib.sha256(raw).hexdigest() and sidecar["bytes"] == len(raw)


# --- the Prefect task cache of evaluations -------------------------------------------------------------

def executor_of(spec: SearchSpec, cached: bool = True):
    from tasks.evaluate import PrefectExecutor

    return PrefectExecutor(spec, spec.build_evaluator(spec.build_space()), retries=0, cached=cached)


SPEC = SearchSpec(space=Component("nb201"), strategy=Component("random"), evaluator=Component("table"), seed=0,
                  trials=3)


def test_evaluation_task_key_follows_each_input():
    from nas.core.trial import Candidate
    from tasks.evaluate import cache_key, evaluate_task

    executor = executor_of(SPEC)
    rng = np.random.default_rng(0)
    a, b = (Candidate(SPEC.build_space().sample(rng)) for _ in range(2))
    inputs = executor.inputs(a)
    base = cache_key(inputs)
    assert base == evaluate_task.cache_policy.compute_key(None, inputs, {})
    assert set(inputs) == {"space", "evaluator", "fingerprint", "encoding", "key", "seed"}
    changes = {"space": {"name": "nb201", "params": {"channels": 8}}, "evaluator": {"name": "table", "params": {
        "metric": "qat_accuracy"}}, "fingerprint": "another table", "encoding": b.arch.encode(), "key": b.arch.key(),
        "seed": 1}
    for field, value in changes.items():
        assert cache_key({**inputs, field: value}) != base, field
    assert executor.inputs(b)["key"] == b.arch.key() and cache_key(executor.inputs(b)) != base
    # the run's seed is an input only where the evaluator's results depend on it
    assert executor_of(dataclasses.replace(SPEC, seed=5)).inputs(a) == inputs
    train = dataclasses.replace(SPEC, evaluator=Component("train", {
        "data": DIGITS, "recipe": {"epochs": 1}, "seeds": None, "channels": 4, "cells_per_stage": 1}))
    assert executor_of(train).inputs(a)["seed"] == 0
    assert executor_of(dataclasses.replace(train, seed=5)).inputs(a)["seed"] == 5


def test_evaluation_cache_is_read_only_when_cached():
    """`cached=False` (`nas search ... cache=false`): every evaluation runs, none reads a record."""
    assert executor_of(SPEC, cached=False).task.refresh_cache is True
    assert not executor_of(SPEC, cached=True).task.refresh_cache
    assert executor_of(SPEC, cached=True).refresh.refresh_cache is True


def test_evaluation_task_builds_one_evaluator_per_config():
    """A task run submitted by the search uses its evaluator; task runs in another process build
    theirs from the configs: two configs never share one."""
    from tasks import evaluate

    executor = executor_of(SPEC)
    space, table = json.dumps(executor.space, sort_keys=True), json.dumps(executor.evaluator, sort_keys=True)
    with executor.sharing():
        assert evaluate._evaluator(space, table) is executor.own[2]
        other = json.dumps({"name": "table", "params": {"metric": "qat_accuracy"}}, sort_keys=True)
        assert evaluate._evaluator(space, other).metric == "qat_accuracy"
    assert evaluate._evaluator(space, table) is not executor.own[2]  # outside a submission: built from the config


def test_evaluation_cache_is_prefect_s_and_cached_false_never_reads_it(prefect_home):
    """Prefect's own task cache: the same candidate again is Cached; with cached=False it runs."""
    from prefect import flow

    from nas.core.trial import Candidate

    cand = Candidate(SPEC.build_space().sample(np.random.default_rng(0)))

    @flow(persist_result=False)
    def twice(cached: bool) -> list[bool]:
        executor = executor_of(SPEC, cached=cached)
        return [executor.evaluate([cand])[0][1] for _ in range(2)]

    assert twice(True) == [False, True]
    assert twice(False) == [False, False]


def test_task_runs_in_the_flow_s_threads_use_the_search_s_own_evaluator(prefect_home, monkeypatch):
    """The evaluator reaches Prefect's task-run threads through the submitting context (a
    ContextVar the thread pool copies), not a module dict: no task run builds one of its own."""
    import threading

    from prefect import flow
    from prefect.task_runners import ThreadPoolTaskRunner

    from nas.core.trial import Candidate
    from tasks import evaluate

    def built(*configs: str):
        raise AssertionError("a task run built its own evaluator")

    monkeypatch.setattr(evaluate, "_built", built)
    rng = np.random.default_rng(1)
    cands = [Candidate(SPEC.build_space().sample(rng)) for _ in range(3)]
    used: list[tuple[Any, str]] = []
    real = evaluate.evaluate_safely

    def seen(ev, arch, seed):
        used.append((ev, threading.current_thread().name))
        return real(ev, arch, seed)

    monkeypatch.setattr(evaluate, "evaluate_safely", seen)

    @flow(persist_result=False, task_runner=ThreadPoolTaskRunner(max_workers=3))
    def search() -> list[Any]:
        executor = executor_of(SPEC, cached=False)
        return [executor.own[2], executor.evaluate(cands)]

    own, outcomes = search()
    assert [result.error for result, _, _ in outcomes] == [None] * 3
    assert len(used) == 3 and all(ev is own for ev, _ in used)
    assert all(name != threading.main_thread().name for _, name in used)  # the pool's threads


# --- supernet training's flow cache --------------------------------------------------------------------

def flow_inputs(**changes: Any) -> dict[str, Any]:
    from supernets.settings import SupernetSettings

    return {"space": {"name": "autoformer", "embed_dims": [48, 64]}, "params": {}, "data": dict(DIGITS),
            "settings": SupernetSettings().to_dict(), "seed": 0, "out": "/runs/sn", "data_fingerprint": "d1",
            **changes}


def test_supernet_flow_key_follows_each_input():
    from prefect.cache_policies import INPUTS

    from flows.supernet import train_supernet_task
    from supernets.settings import SupernetSettings

    def key(inputs: dict[str, Any]) -> str:
        ours = INPUTS.compute_key(None, inputs, {})  # what `_must_retrain` checks
        assert ours == train_supernet_task.cache_policy.compute_key(None, inputs, {})
        return ours

    base = key(flow_inputs())
    values = {"sampling": "fair", "strategy": "ddp", "accelerator": "cpu", "cpu_seconds": 10.0}
    for field in dataclasses.fields(SupernetSettings):  # every setting, as the flow spells them (`to_dict`)
        other = values.get(field.name, _other(field.default))
        settings = SupernetSettings(**{field.name: other}).to_dict()
        assert key(flow_inputs(settings=settings)) != base, f"supernet.{field.name}"
    for field, value in {"space": {"name": "autoformer", "embed_dims": [48]}, "params": {"depth": 2},
                         "data": {**DIGITS, "name": "fashion_mnist"}, "seed": 1, "out": "/runs/other",
                         "data_fingerprint": "d2"}.items():
        assert key(flow_inputs(**{field: value})) != base, field


def test_supernet_flow_cache_is_refused_for_a_checkpoint_changed_in_place(tmp_path):
    """A cached training result names its checkpoint and its sha256: read only while the file is that file."""
    from prefect.cache_policies import INPUTS
    from prefect.results import ResultRecord, ResultRecordMetadata
    from prefect.settings import PREFECT_RESULTS_LOCAL_STORAGE_PATH, temporary_settings

    from flows.supernet import _must_retrain
    from tasks.records import SERIALIZER, record_path

    checkpoint = tmp_path / "sn" / "supernet.pt"
    checkpoint.parent.mkdir()
    checkpoint.write_bytes(b"weights-1")
    inputs = flow_inputs(out=str(checkpoint.parent))
    with temporary_settings({PREFECT_RESULTS_LOCAL_STORAGE_PATH: tmp_path / "results"}):
        assert _must_retrain(inputs) is False  # no record: Prefect trains (nothing to refuse)
        key = INPUTS.compute_key(None, inputs, {})
        path = record_path(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        result = {"path": str(checkpoint), "sha256": hashlib.sha256(b"weights-1").hexdigest(),
                  "val_accuracy_largest": 50.0, "val_accuracy_smallest": 10.0, "steps": 1, "wall_seconds": 0.1}
        path.write_bytes(ResultRecord(metadata=ResultRecordMetadata(serializer=SERIALIZER, storage_key=str(path)),
                                      result=result).serialize())
        assert _must_retrain(inputs) is False
        checkpoint.write_bytes(b"weights-2")   # same size, changed in place
        assert _must_retrain(inputs) is True
        checkpoint.write_bytes(b"weights-1")
        assert _must_retrain(inputs) is False
        checkpoint.unlink()
        assert _must_retrain(inputs) is True


def idx_folder(root: Path, pixel: int = 0, label: int = 0) -> dict[str, Any]:
    """A tiny Fashion-MNIST folder (IDX files: 8 training and 4 test images of 28x28)."""
    root.mkdir(parents=True, exist_ok=True)
    for stem, n in (("train", 8), ("t10k", 4)):
        images = np.arange(n * 28 * 28, dtype=np.uint32).astype(np.uint8).reshape(n, 28, 28)
        labels = (np.arange(n) % 10).astype(np.uint8)
        if stem == "train":
            images[0, 0, 0], labels[0] = pixel, label
        (root / f"{stem}-images-idx3-ubyte.gz").write_bytes(gzip.compress(struct.pack(">iiii", 2051, n, 28, 28)
                                                                           + images.tobytes()))
        (root / f"{stem}-labels-idx1-ubyte.gz").write_bytes(gzip.compress(struct.pack(">ii", 2049, n)
                                                                           + labels.tobytes()))
    return {"name": "fashion_mnist", "root": str(root), "split_file": None}


def test_supernet_flow_data_fingerprint_follows_the_images_not_the_place(tmp_path):
    """sha256 of the images and labels as loaded: a dataset changed in place retrains (in a new
    process: `load_data` keeps one load per process and dataset), a moved one has the same."""
    from flows.supernet import fingerprint_data
    from nas.data.sources import load_data

    def fingerprint(data: dict[str, Any]) -> str:
        load_data.cache_clear()
        return fingerprint_data.fn(data)

    base = fingerprint(idx_folder(tmp_path / "a"))
    assert fingerprint(idx_folder(tmp_path / "b")) == base                       # the same files elsewhere
    assert fingerprint(idx_folder(tmp_path / "a", pixel=255)) != base            # one pixel, in place
    assert fingerprint(idx_folder(tmp_path / "a", label=3)) != base              # one label, in place
    assert fingerprint(idx_folder(tmp_path / "a")) == base
    assert load_data(**idx_folder(tmp_path / "a")) is load_data(**idx_folder(tmp_path / "a"))  # the memo


# --- kept sandbox verdicts --------------------------------------------------------------------------------

def test_verdict_key_follows_each_limit():
    from nas.design.verdicts import verdict_key
    from nas.sandbox.limits import Limits

    limits = Limits(wall_s=60)
    base = verdict_key("src", "parent", 10, (2, 3, 32, 32), limits)
    for field, value in dataclasses.asdict(limits).items():
        assert verdict_key("src", "parent", 10, (2, 3, 32, 32), dataclasses.replace(limits, **{
            field: _other(value)})) != base, f"limits.{field}"
    for other in (("src2", "parent", 10, (2, 3, 32, 32)), ("src", "parent2", 10, (2, 3, 32, 32)),
                  ("src", None, 10, (2, 3, 32, 32)), ("src", "parent", 11, (2, 3, 32, 32)),
                  ("src", "parent", 10, (2, 3, 16, 16)), ("src", "parent", 10, (1, 3, 32, 32))):
        assert verdict_key(*other, limits) != base, other


# --- knowledge records ------------------------------------------------------------------------------------

def test_knowledge_record_ids():
    from nas.knowledge.idea import Idea, Tag
    from nas.knowledge.store import Experience, KnowledgeStore

    idea = Idea("Add a squeeze-excite gate.")
    assert Idea("Add a gate.").id != idea.id
    assert Idea(" add a  squeeze-excite gate ", tag=Tag("performance", "block", "attention"), source="x",
                paper_id="p", paper_title="t").id == idea.id            # spelling, tags and origin: one idea
    tip = Experience("Use padding 1.", "tip")
    assert Experience("Use padding 2.", "tip").id != tip.id != Experience("Use padding 1.", "suggestion").id
    assert Experience("use padding 1", "tip", error="e", idea="i", context={"a": 1}, source="s").id == tip.id
    assert KnowledgeStore.paper_id("h1") == KnowledgeStore.paper_id("h1") != KnowledgeStore.paper_id("h2")


def test_paper_hash_follows_the_content_not_the_file():
    from nas.knowledge.papers import Paper

    base = Paper("T", "A", "B", ideas=[{"text": "i"}])
    for change in ({"title": "T2"}, {"abstract": "A2"}, {"body": "B2"}, {"ideas": [{"text": "j"}]}):
        assert Paper(**{**dataclasses.asdict(base), **change}).hash != base.hash, change
    for change in ({"source": "elsewhere.jsonl"}, {"line": 7}, {"year": 2020}, {"venue": "V"}):
        assert Paper(**{**dataclasses.asdict(base), **change}).hash == base.hash, change


# --- compare groups, run identities, architectures ------------------------------------------------------------

def summary_of(spec: SearchSpec) -> dict[str, Any]:
    return {"spec": spec.to_dict(), "space": spec.space.name, "evaluator": spec.evaluator.name,
            "strategy": spec.strategy.name, "seed": spec.seed}


TRAIN_SPEC = SearchSpec(space=Component("nb201", {"channels": 16}), strategy=Component("rea", {"sample_size": 5}),
                        evaluator=Component("train", {"data": {"name": "cifar10", "root": "/data", "workers": 2},
                                                      "recipe": {"epochs": 12}, "sandbox": {"wall_s": 60}}),
                        seed=0, trials=100)


def _evaluator_with(params: dict[str, Any]) -> Component:
    return Component("train", params)


RESULT_CHANGES = {
    "dataset": {"evaluator": _evaluator_with({**TRAIN_SPEC.evaluator.params, "data": {"name": "cifar100"}})},
    "space setting": {"space": Component("nb201", {"channels": 32})},
    "evaluator setting": {"evaluator": _evaluator_with({**TRAIN_SPEC.evaluator.params, "recipe": {"epochs": 200}})},
    "budget": {"trials": 50},
    "constraint": {"constraint": Constraint(flops=1e8)},
}
RESULT_NEUTRAL = {
    "data root": {"evaluator": _evaluator_with({**TRAIN_SPEC.evaluator.params,
                                                "data": {"name": "cifar10", "root": "/mnt", "workers": 2}})},
    "data workers": {"evaluator": _evaluator_with({**TRAIN_SPEC.evaluator.params,
                                                   "data": {"name": "cifar10", "root": "/data", "workers": 8}})},
    "sandbox limits": {"evaluator": _evaluator_with({**TRAIN_SPEC.evaluator.params, "sandbox": {"wall_s": 600}})},
    "seed": {"seed": 1},
    "strategy setting": {"strategy": Component("rea", {"sample_size": 10})},
}


@pytest.mark.parametrize("change", [*RESULT_CHANGES, *RESULT_NEUTRAL])
def test_compare_setting_follows_each_result_input(change):
    """Runs share an axis unless they differ in a setting that changes results (dataset, space,
    evaluator, budget, constraint); the seed, the strategy and where things are do not split them."""
    from nas.compare import mixed_fields, run_setting

    other = dataclasses.replace(TRAIN_SPEC, **{**RESULT_CHANGES, **RESULT_NEUTRAL}[change])
    settings = {Path("a"): run_setting(summary_of(TRAIN_SPEC)), Path("b"): run_setting(summary_of(other))}
    assert bool(mixed_fields(settings)) is (change in RESULT_CHANGES), mixed_fields(settings)


def test_compare_group_label_follows_the_strategy_settings():
    from nas.compare import screen_label, strategy_settings
    from nas.search.screen import ScreenSettings

    base = strategy_settings(summary_of(TRAIN_SPEC))
    for change in ({"strategy": Component("rea", {"sample_size": 10})}, {"batch_size": 4}, {"in_flight": 2}):
        assert strategy_settings(summary_of(dataclasses.replace(TRAIN_SPEC, **change))) != base, change
    assert strategy_settings(summary_of(dataclasses.replace(TRAIN_SPEC, strategy=Component("rea", {
        "sample_size": 5, "llm": {"timeout_s": 9}})))) == base   # where and how long: no other group
    screened = dataclasses.replace(TRAIN_SPEC, screen=ScreenSettings(factor=4))
    assert screen_label(TRAIN_SPEC.to_dict()) == "" and screen_label(screened.to_dict()) == "+screen(x4,predictor)"


def test_search_identity_follows_each_field_but_the_budget():
    from nas.search.screen import ScreenSettings

    base = TRAIN_SPEC.identity()
    for change in ({"space": Component("nb201", {"channels": 32})}, {"strategy": Component("rea", {"sample_size": 9})},
                   {"strategy": Component("random")}, {"evaluator": Component("table")}, {"seed": 1},
                   {"batch_size": 2}, {"in_flight": 2}, {"constraint": Constraint(params=1e6)},
                   {"screen": ScreenSettings(factor=2)}):
        assert dataclasses.replace(TRAIN_SPEC, **change).identity() != base, change
    assert dataclasses.replace(TRAIN_SPEC, trials=500).identity() == base


@pytest.mark.parametrize("change", [*RESULT_CHANGES, *RESULT_NEUTRAL])
def test_resume_accepts_result_neutral_changes_only(change, tmp_path):
    """A run dir resumes across a change that changes no result (where the data is, a sandbox limit)
    and refuses any other; the budget and the seed are the run's own (the seed changes results)."""
    from nas.errors import RunDirError
    from nas.search.rundir import RunDir

    run = RunDir(tmp_path)
    run.prepare(TRAIN_SPEC.identity_fields(), 1)
    run.save_state(TRAIN_SPEC.identity_fields(), 0, {}, 0.0)
    other = dataclasses.replace(TRAIN_SPEC, **{**RESULT_CHANGES, **RESULT_NEUTRAL}[change])
    resumes = change in ("data root", "data workers", "sandbox limits", "budget")
    if resumes:
        assert run.prepare(other.identity_fields(), 1) is not None
    else:
        with pytest.raises(RunDirError, match="holds a different search"):
            run.prepare(other.identity_fields(), 1)


class _Cell(Architecture):
    """Two spaces whose architectures write the same canonical text."""

    space = "one"

    def __init__(self, text: str) -> None:
        self.text = text

    def canonical(self) -> str:
        return self.text

    def encode(self) -> str:
        return self.text

    @classmethod
    def decode(cls, data: Any) -> "_Cell":
        return cls(data)


class _OtherCell(_Cell):
    space = "two"


def test_architecture_key_holds_the_space_and_the_canonical_form():
    assert _Cell("a").key() == _Cell("a").key() != _Cell("b").key()
    assert _OtherCell("a").key() != _Cell("a").key()


def test_nader_section_keys_are_per_role():
    from nas.spaces.nader.arch import BlockArch

    text = (ROOT / "nas/spaces/nader/dag/bases/resnet_basic.txt").read_text()
    base = BlockArch.from_text(text)
    edited = BlockArch.from_text(text.replace("kernel_size=3", "kernel_size=5", 1))
    a, b = base.section_keys(), edited.section_keys()
    changed = {role for role in a if a[role] != b[role]}
    assert len(changed) == 1 and len(set(a.values())) == len(a)   # one role changed; roles never share a key
    assert copy.deepcopy(a) == BlockArch.from_text(text).section_keys()
    same = BlockArch.from_text(text)
    same._forms = dict.fromkeys(a, "one form")   # sections that read alike in two roles are still two keys
    assert len(set(same.section_keys().values())) == len(a)
