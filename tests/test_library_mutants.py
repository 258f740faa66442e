"""Small checks that the library mutation run (benchmarks/mutation.py --library, issue 52) found
missing: each kills a sampled mutant that no test ran or noticed."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import types

import pytest
import torch

from conftest import ROOT


def test_best_at_n_is_the_curve_s_value_and_a_run_with_none_by_then_is_one_line():
    from nas.errors import EvaluationError
    from nas.regression.probes import _at

    assert _at([91.5, None, 93.0], 1, "random") == 91.5
    assert _at([91.5, None, 93.0], 3, "random") == 93.0
    with pytest.raises(EvaluationError, match="a rea run has no successful trial among its first 2"):
        _at([None, None, 93.0], 2, "rea")


def test_throughput_probe_times_the_forward_pass_after_two_warm_ups(monkeypatch):
    from nas.regression import probes

    calls = []

    class Net(torch.nn.Module):
        def forward(self, x):
            calls.append(tuple(x.shape))
            return x.mean()

    monkeypatch.setattr(probes.NB201Space, "build", lambda self, cell, num_classes: Net())
    monkeypatch.setattr(probes, "TableEvaluator", lambda space: types.SimpleNamespace(evaluate=lambda cell: None))
    metrics = probes.throughput_probe(ROOT, [], lookups=3, forward_repeats=2)
    assert calls == [(16, 3, 32, 32)] * 4  # 2 warm-ups and the 2 timed
    assert metrics["forward_ms"].value >= 0 and metrics["table_evals_per_s"].value > 0
    assert "forward_ms" not in probes.throughput_probe(ROOT, [], lookups=3, forward_repeats=0)


def test_a_product_of_two_literal_dims_is_their_product():
    from nas.spaces.nader.dag.ops import const, dim_mul

    assert dim_mul(const(6), const(4)) == const(24)
    assert dim_mul(const(1), const(5)) == const(5) and dim_mul(const(7), const(1)) == const(7)


def test_grey_images_become_three_equal_channels_and_two_channels_are_refused():
    from nas.data.sources import ImageData, Split

    def split(c):
        return Split(torch.arange(2 * c * 4 * 4, dtype=torch.uint8).reshape(2, c, 4, 4), torch.tensor([0, 1]))

    grey = ImageData("g", split(1), split(1), split(1), 2, (0.5,), (0.2,), 0)
    rgb = grey.rgb()
    assert rgb.shape == (3, 4, 4) and rgb.mean == (0.5, 0.5, 0.5) and rgb.std == (0.2, 0.2, 0.2)
    assert torch.equal(rgb.train.images[:, 2], grey.train.images[:, 0])
    assert rgb.rgb() is rgb
    two = ImageData("t", split(2), split(2), split(2), 2, (0.5, 0.5), (0.2, 0.2), 0)
    with pytest.raises(ValueError, match="cannot make 2-channel images RGB"):
        two.rgb()


def test_a_paper_without_an_abstract_heading_keeps_a_first_paragraph_that_is_not_its_title():
    from nas.knowledge.papers import _Bad, _read_text

    text = "The first paragraph here is the abstract of this paper.\n\nThe second one is its body."
    paper = _read_text(text, "p.md", title_hint="Another Title")
    assert paper.abstract == "The first paragraph here is the abstract of this paper."
    assert paper.body == "The second one is its body."
    titled = _read_text("# A Title\n\nThe abstract of a paper in five words or more.\n\nBody.", "p.md")
    assert titled.title == "A Title" and titled.abstract.startswith("The abstract of a paper")
    one = _read_text("Just one paragraph that is long enough to be an abstract.", "p.md",
                     title_hint="Just one paragraph that is long enough to be an abstract.")
    assert one.abstract.startswith("Just one paragraph")  # the only paragraph stays, though it is the title
    with pytest.raises(_Bad):
        _read_text("Short.\n\nToo short too.", "p.md", title_hint="T")


def test_the_design_section_counts_missing_llm_usage_fields_as_zero():
    from nas.report import _design_section

    design = {"proposals": 2, "valid": 1, "pass_rate": 0.5, "duplicates": 0, "executability": 1.0,
              "success_rate": 0.5, "tokens_per_valid_design": None}
    lines = _design_section([], {"design": design, "llm": {"total": {"prompt_tokens": 1234}}})
    assert ("LLM: 0 calls (0 live, 0 cached, 0 replayed, 0 failed), 1,234 prompt + 0 completion tokens."
            in lines)


def test_prefect_progress_gives_up_after_the_first_refusal():
    from nas.train.progress import EpochProgress
    from tasks import progress

    calls = []

    def refuse(*args, **kwargs):
        calls.append(args)
        raise RuntimeError("no API")

    fake = types.SimpleNamespace(create_progress_artifact=refuse, update_progress_artifact=refuse)
    reporter = progress.PrefectProgress(min_interval=0.0)
    original = progress.artifacts
    progress.artifacts = fake  # type: ignore[assignment]
    try:
        reporter(EpochProgress("a", 1, 3, 0.5, 1.0))
        reporter(EpochProgress("b", 1, 3, 0.5, 1.0))
        reporter(EpochProgress("a", 3, 3, 0.5, 1.0))
    finally:
        progress.artifacts = original
    assert reporter.broken and len(calls) == 1


def test_a_training_worker_that_exits_0_without_a_result_is_one_line(monkeypatch):
    from nas.errors import EvaluationError
    from nas.spaces.nb201.space import NB201Space
    from nas.train import worker

    space = NB201Space()
    arch = space.sample(__import__("numpy").random.default_rng(0))
    monkeypatch.setattr(worker.subprocess, "run",
                        lambda *a, **k: subprocess.CompletedProcess(a, 0, stdout="", stderr="done\n"))
    with pytest.raises(EvaluationError, match="exited with status 0: done"):
        worker.train_in_subprocess(space, arch, data={}, recipe={}, engine={}, build={}, seed=0)


def test_the_local_server_that_exits_before_it_is_ready_says_so():
    from nas.llm.local import LocalServer

    server = object.__new__(LocalServer)
    server.startup_timeout_s = 30.0
    server._proc = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    server._proc.wait()
    assert server._wait_ready("http://127.0.0.1:9/v1") == "exited with status 3 before it was ready"


def test_the_trusted_worker_reads_exactly_what_it_was_sent_or_exits(monkeypatch):
    from nas.sandbox import trusted_worker

    monkeypatch.setattr(sys, "stdin", types.SimpleNamespace(buffer=io.BytesIO(b"abcd")))
    assert trusted_worker._read(3) == b"abc"
    with pytest.raises(SystemExit):
        trusted_worker._read(3)  # one byte left: the parent went away


def test_the_trusted_worker_caps_its_data_segment_above_what_it_holds_and_reports_its_rss():
    code = """
import json, resource
from nas.sandbox import trusted_worker as w
sent = []
w._send = sent.append
w._limit(64)
soft, hard = resource.getrlimit(resource.RLIMIT_DATA)
print(json.dumps({"soft": soft, "hard": hard, "data": w._status("self", "VmData"), "sent": sent,
                  "core": resource.getrlimit(resource.RLIMIT_CORE)}))
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT,
                          check=True)
    got = json.loads(done.stdout.splitlines()[-1])
    assert got["soft"] == got["hard"] and got["core"] == [0, 0]
    assert got["data"] < got["soft"] <= got["data"] + 64 * (1 << 20)  # 64 MiB over what it held then
    assert len(got["sent"]) == 1 and got["sent"][0]["ready"] > 1 << 20  # its resident bytes


def test_counts_shorten_to_k_from_exactly_a_thousand_and_to_m_from_a_million():
    from nas.compare import _fmt_int

    assert [_fmt_int(v) for v in (999, 1000, 1500, 1_000_000, 2_500_000)] == ["999", "1k", "1.5k", "1M", "2.5M"]
    # at each unit's edge: the unit follows the rounded value (never "1e+03k")
    assert [_fmt_int(v) for v in (999.4, 999.5, 999_499, 999_500, 999_999, 999_499_999, 999_500_000, 3e9)] == \
        ["999", "1k", "999k", "1M", "1M", "999M", "1G", "3G"]


def test_a_baseline_strategy_matches_groups_of_one_run_each():
    from nas.compare import baseline_groups

    groups = {"random @ nb201/table": [{"strategy": "random", "space": "nb201", "evaluator": "table"}],
              "rea @ nb201/table": [{"strategy": "rea", "space": "nb201", "evaluator": "table"}]}
    assert baseline_groups(groups, "random") == ["random @ nb201/table"]
    assert baseline_groups(groups, "rea @ nb201/table") == ["rea @ nb201/table"]


@pytest.mark.parametrize("name", ["dask", "ray", "local"])
def test_other_runners_report_to_the_flow_s_server_and_prefect_s_own_needs_no_url(monkeypatch, name):
    from contextlib import contextmanager

    from prefect.settings import PREFECT_API_URL

    from flows import task_runners as runners

    @contextmanager
    def api(show):
        yield "http://127.0.0.1:9/api"

    monkeypatch.setattr(runners, "prefect_api", api)
    before = PREFECT_API_URL.value()
    with runners.shared_api({"name": name}):
        assert PREFECT_API_URL.value() == "http://127.0.0.1:9/api"
    with runners.shared_api({"name": "prefect"}):
        assert PREFECT_API_URL.value() == before
    assert PREFECT_API_URL.value() == before


def test_the_decision_table_numbers_single_positions_from_one():
    from nas.agents.collm.agents import decision_table
    from test_collm import Numeric

    table = decision_table(Numeric())
    assert "- position 1 (r): one of 160, 192, 224" in table
    assert "- position 4 (ratio): one of" in table and "positions 2-3 (k1, k2)" in table


@pytest.mark.parametrize("group", ["strategy", "evaluator"])
def test_plain_python_defaults_are_the_config_files_values(group):
    """`NaderStrategy(space, seed)` in plain Python gets what `nas search strategy=nader` gets: every
    scalar a config file sets (not an interpolation) is the class's default for that argument
    (a None default means a built-in table, which the file spells out)."""
    import inspect

    import yaml

    from nas.evaluators.base import EVALUATORS
    from nas.strategies.base import STRATEGIES

    registry = {"strategy": STRATEGIES, "evaluator": EVALUATORS}[group]
    compared = 0
    for path in sorted((ROOT / "conf" / group).glob("*.yaml")):
        cfg = yaml.safe_load(path.read_text())
        params = inspect.signature(registry.get(cfg["name"])).parameters
        for key, value in cfg.items():
            default = params[key].default if key in params else None
            if key == "name" or isinstance(value, (dict, list)) or default in (None, inspect.Parameter.empty):
                continue
            if isinstance(value, str) and "${" in value:
                continue
            assert default == value, f"{path.name}: {key} is {value!r} there, {default!r} in Python"
            compared += 1
    assert compared >= 20


def test_nader_takes_one_idea_and_no_experiences_but_not_less(monkeypatch):
    from nas.agents.nader.strategy import NaderStrategy
    from nas.errors import ConfigError
    from nas.spaces.nader.space import BlockSpace

    monkeypatch.setenv("NASFLOW_TEST_KEY", "sk-test")
    llm = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": "NASFLOW_TEST_KEY",
           "max_retries": 0, "structured": "none", "cache": False}

    def make(**kwargs):
        return NaderStrategy(BlockSpace(), 0, llm=llm, use_knowledge=False, lde=False, cells_per_stage=1, **kwargs)

    least = make(ideas=1, lif_tries=1, experiences=0)
    assert (least.ideas_k, least.lif_tries, least.experiences_k) == (1, 1, 0)
    for bad in ({"ideas": 0}, {"lif_tries": 0}, {"experiences": -1}):
        with pytest.raises(ConfigError, match="lif_tries and ideas must be >= 1, experiences >= 0"):
            make(**bad)


@pytest.mark.parametrize("argv, status", [(["--help"], 0), (["-h"], 0), ([], 2)])
def test_nas_knowledge_help_or_nothing_prints_its_usage(capsys, argv, status):
    from nas.cli import knowledge

    with pytest.raises(SystemExit) as done:
        knowledge.main(argv)
    assert done.value.code == status
    assert capsys.readouterr().out.strip() == knowledge.__doc__.strip()


def test_a_kept_verdict_says_it_was_kept_and_the_check_runs_once(tmp_path):
    from nas.design.verdicts import VerdictCache
    from nas.sandbox.verify import Verdict

    cache, checks = VerdictCache(tmp_path), []

    def check():
        checks.append(1)
        return Verdict(ok=False, stage="forward", error="forward: RuntimeError: boom")

    first = cache.verdict("ab" * 16, check)
    again = cache.verdict("ab" * 16, check)
    assert (first[1], again[1], len(checks)) == (False, True, 1)
    assert again[0].error == first[0].error == "forward: RuntimeError: boom"


def test_brief_keeps_a_repr_of_up_to_40_characters_whole():
    from nas.core.trial import _brief

    assert _brief("x" * 38) == repr("x" * 38)  # 40 characters with its quotes
    assert _brief("x" * 39) == repr("x" * 39)[:39] + "…"


def test_executability_counts_only_valid_designs_that_trained():
    from nas.core.trial import TrialRecord
    from nas.design.metrics import design_metrics

    def rec(node, accuracy, parent=None, valid=True, **info):
        return TrialRecord(node, f"k{node}", {}, accuracy,
                           strategy={"node": node, "parent": parent, "valid": valid, **info})

    designs = [rec(1, 60.0, parent=0, tokens=30), rec(2, None, parent=0, duplicate=True, tokens=12),
               rec(3, 40.0, parent=0, duplicate=False), rec(4, None, valid=False, duplicate=True, tokens=3)]
    got = design_metrics(designs, [rec(0, 50.0), *designs])
    assert got == {"proposals": 4, "valid": 3, "pass_rate": 3 / 4, "duplicates": 2, "executability": 2 / 3,
                   "success_rate": 1 / 2, "tokens_per_valid_design": 45 / 3}
    assert design_metrics([]) == {"proposals": 0, "valid": 0, "pass_rate": 0.0, "duplicates": 0,
                                  "executability": 0.0, "success_rate": 0.0, "tokens_per_valid_design": None}
    # a parent without an accuracy is beaten by nobody; a record without `valid` is no design
    assert design_metrics([rec(5, 70.0, parent=4)], designs)["success_rate"] == 0.0
    assert design_metrics([TrialRecord(9, "k9", {}, 1.0)])["proposals"] == 0


def test_an_evaluation_that_fails_costs_the_seconds_it_took():
    from nas.errors import EvaluationError
    from nas.evaluators.base import evaluate_safely

    class Failing:
        def evaluate(self, arch, seed):
            raise EvaluationError("no")

    result = evaluate_safely(Failing(), None, 0)  # type: ignore[arg-type]
    assert result.accuracy is None and result.error == "no" and 0 <= result.cost_seconds < 5


def test_the_llm_client_accounts_each_reply_s_tokens_retries_and_truncation():
    from nas.llm.accounting import Usage
    from nas.llm.client import LLMClient

    client = object.__new__(LLMClient)
    client.usage = Usage()
    client._account({"role": "modifier", "source": "live", "prompt_tokens": 120, "completion_tokens": 30,
                     "retries": 2, "finish_reason": "length", "latency_s": 1.5})
    client._account({"role": "modifier", "source": "cache", "prompt_tokens": None, "completion_tokens": None,
                     "retries": None, "finish_reason": "stop", "latency_s": None})
    u = client.usage.roles["modifier"]
    assert (u.calls, u.live, u.cached, u.prompt_tokens, u.completion_tokens, u.retries, u.truncated) == (
        2, 1, 1, 120, 30, 2, 1)
    assert u.latency_s == 1.5


def test_knowledge_takes_one_idea_and_one_method_character_but_not_none():
    from nas.errors import ConfigError
    from nas.knowledge.config import KnowledgeConfig

    cfg = KnowledgeConfig.from_dict({"max_ideas": 1, "max_method_chars": 1})
    assert (cfg.max_ideas, cfg.max_method_chars) == (1, 1)
    for bad in ({"max_ideas": 0}, {"max_method_chars": 0}):
        with pytest.raises(ConfigError, match="max_ideas and knowledge.max_method_chars must be > 0"):
            KnowledgeConfig.from_dict(bad)


def test_proxy_screening_takes_any_positive_image_shape_and_refuses_others():
    from nas.errors import ConfigError
    from nas.proxies.screen import ProxyScorer
    from nas.spaces.nb201.space import NB201Space

    assert ProxyScorer(NB201Space(), shape=[1, 1, 1]) is not None  # grey, one pixel: still an image
    for bad in ([3, 8], [3, 0, 8], [3, 8, 8, 1], [3, 8.0, 8]):
        with pytest.raises(ConfigError, match="screen.params.shape must be"):
            ProxyScorer(NB201Space(), shape=bad)


def test_a_batched_local_evaluation_is_never_marked_cached_and_splits_its_wall_time():
    from nas.core.trial import EvalResult
    from nas.search.loop import LocalExecutor

    class Batched:
        batched = True

        def evaluate_batch(self, archs, seed):
            return [EvalResult(accuracy=float(a)) for a in archs]

    got = LocalExecutor(Batched(), 0).evaluate([types.SimpleNamespace(arch=1), types.SimpleNamespace(arch=2)])
    assert [(r.accuracy, cached) for r, cached, _ in got] == [(1.0, False), (2.0, False)]
    assert all(0 <= wall < 5 for _, _, wall in got)


def test_a_probe_s_result_keeps_its_seconds_to_two_decimals_and_a_skip_s_reason(monkeypatch, tmp_path):
    from nas.regression import probes
    from nas.regression.judge import Probe, Suite

    def skipping(workdir, overrides):
        raise probes.ProbeSkipped("no model here")

    clock = iter([100.0, 101.23456])
    monkeypatch.setattr(probes.time, "perf_counter", lambda: next(clock))
    monkeypatch.setitem(probes.SUITES, "t", Suite("t", (Probe("p", skipping),), compare_timings=False))
    got = probes.run_probe("t", "p", tmp_path)
    assert got == {"name": "p", "metrics": {}, "skipped": "no model here", "error": None, "seconds": 1.23}
    assert (tmp_path / "probes" / "p").is_dir()


def test_collm_asks_for_one_line_a_decision_or_grouped_lines_past_the_maximum():
    from nas.agents.collm import strategy
    from nas.core.space import Decision

    def directions(n):
        space = types.SimpleNamespace(decisions=lambda: [Decision(f"d{i}", (1, 2)) for i in range(n)])
        return strategy.CoLLMStrategy._directions(types.SimpleNamespace(space=space))  # type: ignore[arg-type]

    few = directions(strategy.MAX_DIRECTIONS)
    assert few.splitlines() == [f"d{i}: which values to favour or avoid" for i in range(strategy.MAX_DIRECTIONS)]
    assert directions(strategy.MAX_DIRECTIONS + 1) == (
        "- one line of guidance per group of decisions (at most eight lines)")


def test_the_train_evaluator_checks_isolation_for_untrusted_source_only_and_batches_when_concurrent(monkeypatch):
    from nas.evaluators import train
    from nas.spaces.nb201.space import NB201Space
    from nas.spaces.source.space import SourceSpace

    checked = []
    monkeypatch.setattr(train, "isolation", lambda: checked.append(1))
    recipe = {"epochs": 1, "batch_size": 64, "train_subset": 128, "valid_subset": 64, "test_subset": 64}
    train.TrainEvaluator(SourceSpace(), {"name": "digits"}, recipe)
    assert checked == [1]
    plain = train.TrainEvaluator(NB201Space(), {"name": "digits"}, recipe, channels=4, cells_per_stage=1)
    assert checked == [1] and plain.batched is False
    fused = train.TrainEvaluator(NB201Space(), {"name": "digits"}, recipe, engine={"kind": "fast", "concurrent": 2},
                                 channels=4, cells_per_stage=1)
    assert fused.batched is True


def test_the_llm_probe_divides_the_tokens_by_the_seconds_the_calls_took(monkeypatch, tmp_path):
    from nas.regression import probes

    class Server:
        base_url, alias = "http://127.0.0.1:9/v1", "m"

        def __init__(self, **kwargs):
            pass

        def start(self):
            pass

        def stop(self):
            pass

    reply = types.SimpleNamespace(usage=types.SimpleNamespace(completion_tokens=30))
    sdk = types.SimpleNamespace(chat=types.SimpleNamespace(completions=types.SimpleNamespace(create=lambda **k: reply)))
    monkeypatch.setitem(sys.modules, "openai", types.SimpleNamespace(OpenAI=lambda **k: sdk))
    monkeypatch.setattr(probes, "LocalServer", Server)
    monkeypatch.setattr(probes, "check_config", lambda overrides: {"llm": {"backend": "local", "local": {}}})
    clock = iter([1000.0, 1002.0, 1010.0, 1012.0, 1020.0, 1024.0])  # start-up 2 s, then calls of 2 s and 4 s
    monkeypatch.setattr(probes.time, "perf_counter", lambda: next(clock))
    got = probes.llm_probe(tmp_path, [], calls=2, max_tokens=8)
    assert got["tokens_per_s"].value == 10.0 and got["startup_s"].value == 2.0  # 60 tokens in 6 s


def test_the_design_probe_keeps_the_root_s_accuracy_to_two_decimals(monkeypatch, tmp_path):
    from nas.core.trial import TrialRecord
    from nas.regression import probes

    monkeypatch.setattr(probes, "check_config", lambda overrides: {"llm": {"backend": "openai"}})
    monkeypatch.setattr(probes.SearchSpec, "from_config", staticmethod(lambda cfg: cfg))
    monkeypatch.setattr(probes, "execute", lambda *a, **k: {"trials": 2, "design": {"proposals": 1, "valid": 1},
                                                            "llm": {"total": {"tokens": 7}}})
    monkeypatch.setattr(probes, "stop_shared", lambda: None)
    monkeypatch.setattr(probes, "knowledge_store", types.SimpleNamespace(close_client=lambda path: None))
    monkeypatch.setattr(probes, "read_history", lambda path: [TrialRecord(0, "k", {}, 91.23456)])
    got = probes.design_probe(tmp_path, [], trials=2, lif_tries=1)
    assert got["root_accuracy"].value == 91.23
    assert (got["trials"].value, got["proposals"].value, got["valid"].value, got["llm_tokens"].value) == (2, 1, 1, 7)


def _memory_knowledge_store(client=None):
    from qdrant_client import QdrantClient

    from nas.knowledge.embed import Embedder
    from nas.knowledge.store import KnowledgeStore

    return KnowledgeStore(client if client is not None else QdrantClient(":memory:"), embedder=Embedder())


def test_ideas_added_in_batches_keep_each_idea_s_own_vector():
    import numpy as np

    from nas.knowledge.embed import DEFAULT_DIM
    from nas.knowledge.idea import Idea

    store = _memory_knowledge_store()
    ideas = [Idea(f"idea number {i} of a batched import") for i in range(5)]
    vectors = np.eye(5, DEFAULT_DIM, dtype=np.float32)  # orthogonal: none is a near-duplicate of another
    report = store.add_ideas(ideas, batch_size=2, vectors=vectors)
    assert (report.added, report.duplicates) == (5, 0) and store.count() == 5
    for idea, vec in zip(ideas, vectors):
        hit = store.search_vector(vec, k=1)[0]
        assert hit.idea.text == idea.text and hit.score == pytest.approx(1.0)


def test_knowledge_counts_ask_the_store_for_an_exact_count():
    """A Qdrant server's count without `exact` is an estimate from its index (here: all points,
    as if the filter were not applied); the store's counts must be exact."""
    import numpy as np
    from qdrant_client import QdrantClient

    from nas.knowledge.embed import DEFAULT_DIM
    from nas.knowledge.idea import Idea, Tag

    class Estimating(QdrantClient):
        def count(self, collection_name, count_filter=None, exact=True, **kwargs):
            if not exact:
                return super().count(collection_name, exact=True)
            return super().count(collection_name, count_filter=count_filter, exact=True, **kwargs)

    store = _memory_knowledge_store(Estimating(":memory:"))
    ideas = [Idea("Use depthwise separable convolutions.", Tag("efficiency", "operation", "efficient convolution")),
             Idea("Add squeeze-and-excitation channel attention.", Tag("performance", "block", "attention")),
             Idea("Add identity shortcuts around each pair of convolutions.", Tag("performance", "block", "skip"))]
    store.add_ideas(ideas, vectors=np.eye(3, DEFAULT_DIM, dtype=np.float32))
    assert store.count() == 3
    assert store.count(target="performance") == 2 and store.count(target="efficiency") == 1
    assert store.count(main="attention") == 1


def test_naswot_codes_a_relu_unit_as_on_when_its_output_is_positive():
    """NASWOT's kernel counts the units on which two images' binary codes agree, a unit 'on' where
    the ReLU's output is above zero: codes 10, 11 and 01 agree pairwise on one unit, log det = log 4."""
    import math

    from torch import nn

    from nas.proxies.base import Batch
    from nas.proxies.scores import Naswot

    images = torch.tensor([[0.5, -1.0], [0.5, 0.5], [-0.5, 2.0]]).reshape(3, 1, 1, 2)
    batch = Batch(images, torch.tensor([0, 1, 0]), 2, "random")
    assert Naswot().score(nn.Sequential(nn.ReLU()), batch) == pytest.approx(math.log(4))


def _scripted_training_worker(lines):
    """A TrustedWorker whose process only prints `lines` (JSON messages), then waits."""
    from nas.sandbox.trusted import TrustedWorker

    worker = object.__new__(TrustedWorker)
    worker.memory_mb, worker.job = 1024, "training"
    script = "import sys, time\nsys.stdout.write(sys.argv[1])\nsys.stdout.flush()\ntime.sleep(60)"
    text = "".join(json.dumps(line) + "\n" for line in lines)
    worker.proc = subprocess.Popen([sys.executable, "-c", script, text], stdin=subprocess.PIPE,
                                   stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return worker


def test_a_training_worker_s_proxy_scores_are_taken_once_and_a_second_set_is_malformed():
    from nas.sandbox.trusted import Refusal

    start = [{"ready": 0}, {"work": 10, "images": 10, "epochs": 1}, {"proxies": {"naswot": 1.5}}]
    request = {"proxies": {"names": ["naswot"]}}
    for again, expected in [(False, {"failed": "it did not train"}),
                            (True, Refusal("the parent's training of the graph sent a malformed message (proxy "
                                           "scores not asked for, or asked for again)", "crash"))]:
        heard = []
        worker = _scripted_training_worker(start + [{"proxies": {"naswot": 2.5}}] * again
                                           + [{"failed": "it did not train"}])
        try:
            got = worker.train(b"artifact", request, None, heard.append)
        finally:
            worker.close()
        assert got == expected and heard == [{"naswot": 1.5}]


def test_the_trusted_worker_lowers_its_own_priority_for_its_imports_and_no_other_process_s(monkeypatch):
    import os

    from nas.sandbox import trusted_worker

    class Stop(Exception):
        pass

    calls = []

    def limit(memory_mb):
        raise Stop

    monkeypatch.setattr(os, "setpriority", lambda which, who, prio: calls.append((which, who, prio)))
    monkeypatch.setattr(os, "getpriority", lambda which, who: 3)
    monkeypatch.setattr(trusted_worker, "_die_with_parent", lambda parent: None)
    monkeypatch.setattr(trusted_worker, "_limit", limit)
    monkeypatch.setattr(torch, "set_num_threads", lambda n: None)
    with pytest.raises(Stop):
        trusted_worker.main(64, 1, "check", os.getpid())
    assert calls == [(os.PRIO_PROCESS, 0, 13), (os.PRIO_PROCESS, 0, 3)]  # pid 0: the worker itself


def test_the_trusted_check_runs_the_graph_on_the_input_the_sandbox_child_ran_it_on():
    """The sandbox child runs the model on torch.manual_seed(0)'s randn (nas.sandbox.worker._verify);
    the trusted check's forward draws the same input, so a graph finite there is finite here: this
    one is finite only on that input's first image (its output is NaN anywhere else)."""
    from torch import nn

    from nas.sandbox.graph import export_graph, pack
    from nas.sandbox.verify import measure

    shape = (2, 3, 8, 8)
    torch.manual_seed(0)
    first = torch.randn(shape)[:1].clone()

    class OnlyThere(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(3, 10)
            self.register_buffer("there", first)

        def forward(self, x):
            off = (x[:1] - self.there).abs().amax()
            return self.fc(x.mean((2, 3))) + torch.sqrt(off.neg() + 1e-6)

    net = OnlyThere()
    graph = export_graph(net, torch.randn(shape))
    data = pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")})
    verdict = measure(data, num_classes=10, input_shape=list(shape), memory_mb=1024, with_parent=False, batch=256,
                      seeds=[], on_work=lambda units: None)
    assert verdict["ok"], verdict["error"]


@pytest.mark.parametrize("accelerator", ["cpu", "gpu", "auto"])
def test_a_model_source_trains_on_the_gpu_when_asked_or_when_auto_finds_one(monkeypatch, accelerator):
    from nas.evaluators import train
    from nas.spaces.source.space import SourceSpace

    asked = []

    def train_model_source(source, *, gpu, **kwargs):
        asked.append(gpu)
        return types.SimpleNamespace(ok=False, error="not trained here", stage="train", self_reported=False), []

    monkeypatch.setattr(train, "isolation", lambda: None)
    monkeypatch.setattr(train, "train_model_source", train_model_source)
    recipe = {"epochs": 1, "batch_size": 64, "train_subset": 128, "valid_subset": 64, "test_subset": 64}
    space = SourceSpace()
    evaluator = train.TrainEvaluator(space, {"name": "digits"}, recipe, engine={"accelerator": accelerator})
    for cuda in (False, True):
        monkeypatch.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
        assert evaluator._train_source(space.base, [0], {}) == ("not trained here", False)
    assert asked == {"cpu": [False, False], "gpu": [True, True], "auto": [False, True]}[accelerator]


def test_a_retrained_export_s_source_takes_the_data_s_channels(tmp_path):
    """The model.py of a network trained on grey 8x8 images takes one input channel: its `Network`
    loads the built network's weights strictly and gives its output."""
    from nas.export import trusted
    from nas.spaces.nb201.arch import NB201Cell
    from nas.spaces.nb201.space import NB201Space

    space = NB201Space()
    cell = NB201Cell.from_string("|nor_conv_3x3~0|+|skip_connect~0|nor_conv_1x1~1|+|avg_pool_3x3~0|none~1|nor_conv_3x3~2|")
    ev = types.SimpleNamespace(seeds=[0], data=types.SimpleNamespace(shape=(1, 8, 8), num_classes=10),
                               build={"channels": 4, "cells_per_stage": 1}, data_cfg={"name": "digits"})
    built = trusted.from_training(ev, types.SimpleNamespace(seed=0), space, cell, None, False, [].append)
    assert built.shape == (1, 1, 8, 8)
    (tmp_path / "model.py").write_text(built.source)
    torch.save(built.net.state_dict(), tmp_path / "model.pt")
    x = torch.randn(built.shape)
    check = trusted.source_check(built, built.net.eval(), x, tmp_path, None, space)
    assert check["passed"] and check["max_abs_diff"] == 0.0, check


class _Served:
    """The uvicorn child as flows.shared_server's watchdog sees it: serving until `polls` polls,
    or until terminated; `on_poll` runs at each poll."""

    def __init__(self, polls, on_poll=lambda n: None):
        self.polls, self.on_poll, self.n, self.terminated = polls, on_poll, 0, False

    def poll(self):
        self.n += 1
        self.on_poll(self.n)
        return 0 if self.terminated or self.n >= self.polls else None

    def terminate(self):
        self.terminated = True

    def wait(self, timeout=None):
        return 0


@pytest.mark.parametrize("home_removed", [False, True])
def test_the_shared_server_s_watchdog_serves_while_its_home_exists_and_stops_once_it_is_removed(
        monkeypatch, tmp_path, home_removed):
    import shutil

    from flows import shared_server

    home = tmp_path / "prefect"
    home.mkdir()
    served = _Served(6, lambda n: n == 3 and home_removed and shutil.rmtree(home))
    monkeypatch.setattr(shared_server.subprocess, "Popen", lambda *a, **kw: served)
    monkeypatch.setattr(shared_server.signal, "signal", lambda *a: None)
    monkeypatch.setattr(shared_server, "healthy", lambda url, timeout=2.0: True)
    monkeypatch.setattr(shared_server, "POLL_S", 0.0)
    assert shared_server.main(["--dir", str(home), "--port", "4999", "--idle-minutes", "30"]) == 0
    if home_removed:  # stopped at the first look after the removal, the server terminated
        assert served.terminated and served.n == 4
    else:  # not idle (30 minutes): served until the server itself ended
        assert not served.terminated and served.n == 7 and not (home / shared_server.STATE).exists()


@pytest.mark.parametrize("taken", [False, True])
def test_the_shared_server_s_other_port_is_said_in_a_line_of_its_own_only_when_4200_is_taken(
        monkeypatch, tmp_path, capsys, taken):
    from flows import prefect_server

    class Started(Exception):
        pass

    def popen(*args, **kwargs):
        raise Started

    port = prefect_server.PREFERRED_PORT + (7 if taken else 0)
    monkeypatch.setattr(prefect_server, "_running_url", lambda where: None)
    monkeypatch.setattr(prefect_server, "check_prefect_database", lambda: None)
    monkeypatch.setattr(prefect_server, "_free_port", lambda: port)
    monkeypatch.setattr(prefect_server.subprocess, "Popen", popen)
    with pytest.raises(Started):
        prefect_server._start_local_server(tmp_path, False, tmp_path / "log")
    said = capsys.readouterr().err
    if taken:
        assert said.startswith(f"nas: port 4200 is taken, so this home's Prefect UI is at http://127.0.0.1:{port}")
    else:
        assert said == ""


def test_a_curve_under_16_trials_marks_every_trial_and_longer_ones_stagger_every_eighth(monkeypatch, tmp_path):
    from nas import compare

    figures = []
    monkeypatch.setattr(compare, "save_figure", lambda fig, path: figures.append(fig))

    def groups(length):
        return {label: [{"curve": [80.0 + t / 10 for t in range(length)], "random_only": ""}] * 2
                for label in ("random", "rea")}

    compare.plot_curves(groups(5), tmp_path / "short.png")
    compare.plot_curves(groups(40), tmp_path / "long.png")
    marks = [[line.get_markevery() for line in fig.axes[0].lines] for fig in figures]
    for fig in figures:
        compare._pyplot().close(fig)
    assert marks == [[(0, 1), (0, 1)], [(0, 5), (2, 5)]]


def test_prefect_s_server_module_starts_its_children_under_the_guard_once_patched():
    from tasks import env

    server = types.ModuleType("prefect.server.api.server")
    server.subprocess = subprocess
    env._guard(server)
    shim = server.subprocess
    assert shim is not subprocess and shim.Popen is env._GuardedPopen and shim.PIPE == subprocess.PIPE
    assert subprocess.Popen is not env._GuardedPopen  # the process's own module is left as it was
    env._guard(server)
    assert server.subprocess is shim  # patched once


def test_a_proxy_batch_is_normalised_as_training_normalises_and_halved_by_averaging(monkeypatch):
    from nas.data.sources import ImageData, Split
    from nas.proxies.batch import data_batch

    pixels = torch.arange(16, dtype=torch.uint8).reshape(1, 1, 4, 4) * 10
    split = Split(pixels, torch.tensor([3]))
    data = ImageData("g", split, split, split, 10, (0.25,), (0.5,), 0)
    batch = data_batch(data, 1, 0)
    assert torch.allclose(batch.images, (pixels.float() / 255 - 0.25) / 0.5)
    small = data_batch(data, 1, 0, (1, 2, 2)).images  # each output pixel: the mean of its 2x2 block
    blocks = batch.images.reshape(2, 2, 2, 2).permute(0, 2, 1, 3).reshape(2, 2, 4).mean(-1)
    assert torch.allclose(small[0, 0], blocks, atol=1e-6)


def test_loss_gradients_are_the_weights_this_batch_reaches_not_a_stale_one():
    from torch import nn

    from nas.proxies.base import Batch
    from nas.proxies.gradients import loss_gradients

    class TwoHeads(nn.Module):
        def __init__(self):
            super().__init__()
            self.used, self.unused = nn.Linear(4, 3), nn.Linear(4, 3)

        def forward(self, x):
            return self.used(x.flatten(1))

    net = TwoHeads()
    net.unused.weight.grad = torch.ones_like(net.unused.weight)  # left by an earlier backward
    grads = loss_gradients(net, Batch(torch.randn(2, 1, 2, 2), torch.tensor([0, 2]), 3, "random"))
    assert [w for w, _ in grads] == [net.used.weight]


def test_the_proxy_screen_s_data_free_images_are_rgb_32_by_32_unless_told():
    from nas.proxies.screen import ProxyScorer
    from nas.spaces.nb201.space import NB201Space

    assert ProxyScorer(NB201Space()).batch.images.shape == (32, 3, 32, 32)
    assert ProxyScorer(NB201Space(), shape=[1, 8, 8], batch_size=4).batch.images.shape == (4, 1, 8, 8)


def test_a_regression_value_exactly_at_its_tolerance_is_ok_and_past_it_improved_or_regressed():
    from nas.regression.judge import HIGHER, LOWER, judge

    assert judge(1e-9, 0.0, HIGHER, {"abs": 0.0}) == "ok"  # at the bound's own slack
    assert judge(2e-9, 0.0, HIGHER, {"abs": 0.0}) == "improved"
    assert judge(1e-9, 0.0, LOWER, {"abs": 0.0}) == "ok" and judge(2e-9, 0.0, LOWER, {"abs": 0.0}) == "regressed"


def test_the_table_probe_runs_the_baselines_as_the_collm_benchmark_does():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import collm_nb201
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    from nas.regression.probes import TABLE_STRATEGIES

    assert TABLE_STRATEGIES == collm_nb201.BASELINES


def test_a_design_failing_to_the_end_leaves_its_last_draft():
    from nas.design.base import verify_and_retry

    class Chain:
        def run(self, text):
            return types.SimpleNamespace(failure=types.SimpleNamespace(error=f"bad {text}", retry="fix"),
                                         to_dict=lambda: {"ok": False})

    def step(n):
        return types.SimpleNamespace(text=f"draft {n}", label={"attempt": n}, extra={}, error=None)

    attempts = []
    outcome, last = verify_and_retry(Chain(), step(0), lambda o, e, t: step(1) if len(attempts) < 2 else None,
                                     attempts, retry_no_reply=False)
    assert last == "draft 1" and len(attempts) == 2 and outcome.failure.error == "bad draft 1"
    silent = types.SimpleNamespace(text=None, label={"attempt": 0}, extra={}, error="no reply")
    assert verify_and_retry(Chain(), silent, lambda o, e, t: None, [], retry_no_reply=False) == (None, "")


def test_the_structure_check_refuses_a_network_of_one_layer_or_none_saying_how_many():
    from nas.design.verifiers import Structure

    def check(layers):
        verdict = types.SimpleNamespace(changed=True, layers=layers, changed_layers=1)
        return Structure().check(types.SimpleNamespace(facts={"verdict": verdict}))

    for layers, says in [(1, "has 1 layer(s)"), (None, "has 0 layer(s)"), (0, "has 0 layer(s)")]:
        got = check(layers)
        assert not got.ok and says in got.error and "single-layer network is not a design" in got.error
    assert check(2).ok


def test_the_block_budget_takes_a_design_that_fits_only_at_width_one(monkeypatch):
    from nas.design import verifiers

    for width, ok in [(1, True), (0, False)]:
        monkeypatch.setattr(verifiers, "search_width", lambda blocks, skeleton, budget, width=width:
                            types.SimpleNamespace(width=width, params=10, flops=20))
        draft = types.SimpleNamespace(blocks={}, facts={})
        check = verifiers.BlockBudget(None, types.SimpleNamespace(params=1e6, flops=1e8)).check(draft)
        assert check.ok is ok and (draft.facts.get("width") == 1) is ok


def test_a_probe_runs_again_into_the_folder_an_earlier_run_left(monkeypatch, tmp_path):
    from nas.regression import probes

    suite = types.SimpleNamespace(probe=lambda name: types.SimpleNamespace(fn=lambda **kw: {}, params={}))
    monkeypatch.setattr(probes, "get_suite", lambda name: suite)
    for _ in range(2):
        result = probes.run_probe("s", "p", tmp_path)
        assert (result["error"], result["skipped"], result["metrics"]) == (None, None, {})
    assert (tmp_path / "probes" / "p").is_dir()


def test_only_an_llm_task_s_traceback_and_its_uncacheable_failure_are_kept_from_the_log():
    import logging

    from tasks.llm import _OneLineFailures

    def kept(message, task="llm-propose-0"):
        record = logging.LogRecord("prefect.task_runs", logging.ERROR, __file__, 1, message, None, None)
        record.task_run_name = task
        return _OneLineFailures().filter(record)

    assert not kept("Task run failed with exception: LLMError('x')")
    assert not kept("Failed to write result: LLMError('no reply') cannot be serialised")
    assert kept("Failed to write result: OSError: disk full")  # another failure to store: said
    assert kept("an LLMError was retried")
    assert kept("Task run failed with exception", task="evaluate-3")


def _published(monkeypatch) -> list[float]:
    """The progress values tasks.progress sends, recorded instead of Prefect's artifact API."""
    from tasks import progress

    sent: list[float] = []
    monkeypatch.setattr(progress, "artifacts", types.SimpleNamespace(
        create_progress_artifact=lambda value, **kw: sent.append(value) or "id",
        update_progress_artifact=lambda key, value, **kw: sent.append(value)))
    return sent


def test_a_candidate_s_last_epoch_is_published_however_soon_it_comes(monkeypatch):
    from nas.train.progress import EpochProgress
    from tasks import progress

    sent = _published(monkeypatch)
    reporter = progress.PrefectProgress(min_interval=3600.0)
    reporter(EpochProgress("a", 1, 3, 0.5, 1.0))
    reporter(EpochProgress("a", 2, 3, 0.5, 1.0))  # within the interval: not sent
    reporter(EpochProgress("a", 3, 3, 0.5, 1.0))  # the last: sent
    reporter(EpochProgress("b", 1, 3, 0.5, 1.0))
    reporter(EpochProgress("b", 1, 3, 0.5, 1.0, "non-finite loss"))  # terminated: sent
    assert sent == [pytest.approx(33.33), 100.0, pytest.approx(33.33), pytest.approx(33.33)]


def test_a_cache_record_s_foreign_serializer_is_quoted_to_40_characters():
    from tasks.records import _payload

    kind = "x" * 39 + "yz"
    raw = json.dumps({"metadata": {"serializer": {"type": kind}}, "result": "{}"}).encode()
    assert _payload(raw, None) == (None, f"serializer {kind[:40]!r} is not nasflow-json; refusing to load it")


def test_a_batch_s_tickets_come_after_those_still_running():
    from tasks.evaluate import PrefectExecutor

    executor = object.__new__(PrefectExecutor)
    executor._running = {5: ("a candidate still running", 0.0)}
    submitted = []

    def submit(ticket, candidate):
        assert ticket not in executor._running
        submitted.append(ticket)

    executor.submit = submit
    finished = iter([7, 6])
    executor.next_done = lambda: (t := next(finished), f"outcome {t}")
    assert executor.evaluate(["c6", "c7"]) == ["outcome 6", "outcome 7"] and submitted == [6, 7]
    executor._running = {}
    finished = iter([0])
    assert executor.evaluate(["c0"]) == ["outcome 0"] and submitted[-1] == 0


@pytest.mark.parametrize("sources, shown", [
    (5, "a0 5, a1 4, a2 3, a3 2, a4 1"),  # all five, no ellipsis
    (6, "a0 6, a1 5, a2 4, a3 3, a4 2, ..."),  # the first five, then an ellipsis
    (1, "a0 1"),
])
def test_stats_name_at_most_five_sources_and_say_when_there_are_more(sources, shown):
    from nas.knowledge.stats import render_stats

    stats = {"ideas": 10, "papers": 3, "untagged": 1, "experiences": 2,
             "by_source": {f"a{i}": sources - i for i in range(sources)},
             "by_main": [{"target": "block", "granularity": "coarse", "main": "attention", "ideas": 5, "share": 0.5}],
             "by_granularity": {"coarse": 5, "fine": 5}, "mention_attention": 4, "mention_attention_share": 0.4}
    lines = render_stats(stats).splitlines()
    assert lines[0] == f"10 ideas from 3 papers (1 untagged), 2 experiences; sources: {shown}"
    assert lines[3] == f"{'block':<12} {'coarse':<10} {'attention':<52} {5:>6}  50.0% " + "#" * 15
    assert lines[-2:] == ["by granularity: coarse 5, fine 5", "ideas mentioning attention/transformers: 4 "
                          "(40.0 %; FairNAD saw ~70 % attention in raw extraction)"]


class _CountedStore:
    """What `idea_stats` reads of a store: its counts (the store's own are tested with Qdrant elsewhere)."""

    def __init__(self, counts, sources, texts):
        self.counts, self.sources, self.texts = counts, sources, texts

    def category_counts(self):
        return self.counts

    def tag_counts(self):
        return {"source": self.sources}

    def count_papers(self):
        return 2

    def ideas(self):
        from types import SimpleNamespace
        return [SimpleNamespace(text=t) for t in self.texts]


def test_stats_count_each_main_category_its_ideas_and_a_category_without_ideas_none():
    from nas.knowledge.stats import idea_stats
    from nas.knowledge.tree import AttributeTree

    tree = AttributeTree.builtin()
    first, second = tree.mains(target=tree.targets[0])[:2]
    sub = tree.subs(first)[0]
    store = _CountedStore({first: {sub: 3}, "": {"": 1}, "not-in-tree": {"x": 1}},
                          {"papers/a.md": 3, "b.md": 1, "": 1},
                          ["self-attention over channels", "a wider stem", "a deeper stage", "x", "y"])
    stats = idea_stats(store, tree)
    rows = {r["main"]: r for r in stats["by_main"]}
    assert (rows[first]["ideas"], rows[first]["share"], rows[first]["subs"][sub]) == (3, 0.6, 3)
    assert (rows[second]["ideas"], rows[second]["share"]) == (0, 0.0)
    assert sum(r["ideas"] for r in stats["by_main"]) == 3
    assert (stats["ideas"], stats["papers"], stats["untagged"], stats["other_tags"]) == (5, 2, 1, 1)
    assert stats["by_source"] == {"a.md": 3, "b.md": 1, "-": 1}
    assert (stats["mention_attention"], stats["mention_attention_share"]) == (1, 0.2)
    assert stats["largest_main_share"] == 0.6
    empty = idea_stats(_CountedStore({}, {}, []), tree)
    assert (empty["ideas"], empty["mention_attention_share"], empty["largest_main_share"]) == (0, 0.0, 0.0)
    assert all(r["share"] == 0.0 and r["ideas"] == 0 for r in empty["by_main"])


def test_a_cache_record_s_foreign_serializer_options_are_named_to_60_characters():
    from tasks.records import _payload

    options = {f"option_{i:02d}": 1 for i in range(8)}  # 8 names of 9 characters: 86 characters joined
    raw = json.dumps({"metadata": {"serializer": {"type": "nasflow-json", **options}}, "result": "{}"}).encode()
    joined = ", ".join(sorted(options))
    assert _payload(raw, None) == (None, f"serializer options {joined[:60]} are not ours; refusing to load it")
    assert len(joined) > 61


@pytest.mark.parametrize("gap, sent", [(0.5, 1), (1.0, 2), (1.5, 2)])  # at min_interval: sent again
def test_a_candidates_progress_is_published_again_once_min_interval_has_passed(monkeypatch, gap, sent):
    from nas.train.progress import EpochProgress
    from tasks import progress

    published = _published(monkeypatch)
    times = [100.0, 100.0 + gap]  # the first report's time, then the second's (and any later call's)
    monkeypatch.setattr(progress.time, "monotonic", lambda: times.pop(0) if len(times) > 1 else times[0])
    reporter = progress.PrefectProgress(min_interval=1.0)
    reporter(EpochProgress("a", 1, 4, 0.5, 1.0))
    reporter(EpochProgress("a", 2, 4, 0.5, 2.0))
    assert published == [25.0, 50.0][:sent]
