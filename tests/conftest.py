"""Shared fixtures: every test gets its own NASFLOW_HOME (Prefect home and
evaluation cache), so no test sees another's cache or the user's."""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tasks.env import configure_prefect_env

ROOT = Path(__file__).resolve().parents[1]

# Prefect reads its settings once, when first imported, and a test module may import it
# at collection: give this session (each xdist worker) a fresh home before that, so no
# cache ever carries over from another run or the user's ~/.prefect.
for _key in [k for k in os.environ if k.startswith("PREFECT_") and "TIMEOUT" not in k]:
    del os.environ[_key]
os.environ["NASFLOW_HOME"] = tempfile.mkdtemp(prefix="nasflow-tests-")
atexit.register(shutil.rmtree, os.environ["NASFLOW_HOME"], ignore_errors=True)
# Each test's flows use a temporary Prefect server, not the CLI's shared one (flows/prefect_server.py) that
# outlives the command; tests of the shared server set it themselves
os.environ["NASFLOW_PREFECT_SERVER"] = "temporary"
# nor do their searches leave a warm process behind (nas/cli/warm.py); tests/test_warm.py starts its own
os.environ["NASFLOW_WARM"] = "0"
configure_prefect_env()

if os.environ.get("PYTEST_XDIST_WORKER"):
    # `make test` runs one worker per core; torch's default thread pools would then
    # oversubscribe the cores, which is far slower than one thread each.
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ.setdefault(var, "1")

NAS = [sys.executable, "-m", "nas.cli.main"]

# Markers from one table instead of decorators in every file (a file may still mark its own
# slow tests). A key is a test file (all its tests) or "file::test" (every parametrisation of
# that test); tests/test_markers.py fails on a test file missing here or a name that is gone.
#   slow     minutes, end to end: deselected by `make test-fast`
#   sandbox  runs the bubblewrap sandbox child (untrusted model source)
#   llm      needs the local llama.cpp model or the scripted OpenAI-compatible server
#   prefect  starts Prefect: a flow in-process, a server, or `nas search` on the default runner
#   cli      runs the `nas` CLI in a subprocess
MARKERS: dict[str, tuple[str, ...]] = {
    "test_agents_cases.py": (),
    "test_async_search.py": (),
    "test_async_search.py::test_cli_kill_9_mid_async_search_then_resume_loses_and_repeats_nothing": ("cli",),
    "test_base_models.py": ("sandbox",),
    "test_baselines.py": (),
    "test_benchmark_smoke.py": ("slow",),
    "test_benchmark_smoke.py::test_llm_layer_quick": ("llm",),
    "test_benchmark_smoke.py::test_knowledge_quick": ("llm",),
    "test_benchmark_smoke.py::test_import_time_quick_merges_beside_the_committed_before": ("cli",),
    "test_cache_keys.py": (),
    "test_cache_keys.py::test_llm_cache_off_neither_reads_nor_writes_the_reply_cache": ("llm",),
    "test_cache_keys.py::test_evaluation_cache_is_prefect_s_and_cached_false_never_reads_it": ("prefect",),
    "test_cache_safety.py": (),
    "test_cache_safety.py::test_poisoned_evaluation_records_are_refused_by_the_search": ("cli", "prefect"),
    "test_cache_safety.py::test_poisoned_llm_call_record_is_refused_and_the_call_made_again": ("llm", "prefect"),
    "test_cache_safety.py::test_poisoned_supernet_record_is_refused_and_the_supernet_trained_again": ("prefect",),
    "test_cache_safety.py::test_llm_reply_cache_file_of_the_wrong_shape_is_a_miss": ("llm",),
    "test_case_tables.py": (),
    "test_case_tables.py::test_each_http_status_is_retried_or_final": ("llm",),
    "test_case_tables.py::test_a_retried_status_then_a_reply_is_that_reply": ("llm",),
    "test_cli_arch.py": ("cli",),
    "test_cli_arch_fast.py": (),
    "test_cli_arch_fast.py::test_validate_model_files_one_line_each_in_order": ("sandbox",),
    "test_cli_arch_draw.py": (),
    "test_cli_arch_draw.py::test_draw_refuses_an_invalid_file_with_validates_errors_and_writes_nothing": ("cli",),
    "test_cli_cases.py": (),
    "test_cli_config.py": (),
    "test_cli_exit.py": (),
    "test_warm.py": ("cli",),
    "test_cli_config.py::test_ctrl_c_stops_a_search_in_one_line_and_the_same_command_resumes": ("cli",),
    "test_cli_config.py::test_a_run_dir_in_use_gets_no_hydra_files_and_a_free_one_gets_progress_in_search_log":
        ("cli",),
    "test_cli_e2e.py": ("cli", "prefect"),
    "test_data_cases.py": (),
    "test_data_imagenet.py": (),
    "test_cli_latency_imports.py": ("cli",),
    "test_cli_latency_imports.py::test_a_table_search_imports_neither_torch_nor_matplotlib": ("cli", "prefect"),
    "test_shared_server.py": ("slow", "prefect"),
    "test_shared_server.py::test_with_4200_taken_the_address_is_said_in_one_line_and_named_by_the_search_and_nas_ui":
        ("cli",),
    "test_cli_ui.py": ("cli",),
    "test_cluster_dask.py": (),
    "test_cluster_dask.py::test_each_worker_sees_only_its_gpu_and_evaluations_ask_for_it": ("slow", "prefect"),
    "test_cluster_dask.py::test_killed_worker_mid_evaluation_reruns_the_candidate_elsewhere": ("slow", "prefect"),
    "test_cluster_dask.py::test_candidate_that_kills_every_worker_becomes_a_failed_trial": ("slow", "prefect"),
    "test_cluster_dask.py::test_asynchronous_search_runs_on_the_cluster_each_ask_told_once": ("slow", "prefect"),
    "test_cluster_ray.py": (),
    "test_cluster_ray.py::test_local_ray_is_small_and_offers_the_gpus_it_was_given": (),
    "test_cluster_ray.py::test_killed_worker_mid_evaluation_reruns_the_candidate": ("slow", "prefect"),
    "test_cluster_ray.py::test_candidate_that_kills_every_worker_becomes_a_failed_trial": ("slow", "prefect"),
    "test_collm.py": ("llm",),
    "test_compare_checks.py": (),
    "test_compare_stats.py": (),
    "test_compare_stats.py::test_multirun_ablation_then_compare_via_cli": ("cli",),
    "test_console.py": (),
    "test_console.py::test_resumed_search_says_so_and_lowering_the_budget_is_one_line": ("cli", "prefect"),
    "test_config.py": (),
    "test_config_compose_once.py": (),
    "test_config_compose_once.py::test_a_table_search_composes_its_config_once": ("cli",),
    "test_constraint.py": (),
    "test_core_cases.py": (),
    "test_core_mutants.py": (),
    "test_dag_canon.py": (),
    "test_dag_compile.py": (),
    "test_dag_parse.py": (),
    "test_dag_shapes.py": (),
    "test_executor_close.py": (),
    "test_export_cases.py": (),
    "test_export.py": (),
    "test_export.py::test_a_path_that_is_no_run_fails_before_torch_loads": ("cli",),
    "test_export_fast.py": (),
    "test_export.py::test_model_source_is_built_and_exported_only_in_the_sandbox": ("sandbox",),
    "test_export.py::test_model_source_that_breaks_the_policy_fails_in_one_line": ("sandbox",),
    "test_export.py::test_model_source_is_retrained_as_its_exported_graph_in_the_trusted_worker": ("sandbox",),
    "test_export.py::test_model_source_that_cannot_be_exported_is_retrained_in_the_sandbox_and_marked_self_reported":
        ("sandbox",),
    "test_export.py::test_block_file_exports_compiled_source_checked_in_the_sandbox": ("sandbox",),
    "test_export.py::test_model_source_that_fills_its_work_folder_is_stopped_in_one_line": ("sandbox",),
    "test_fairnad.py": (),
    "test_fairnad.py::test_downscale_asks_for_channel_multiples_and_records_those_not_kept": ("llm",),
    "test_fairnad_e2e.py": ("cli", "sandbox", "llm", "prefect"),
    "test_fairnad_forger_e2e.py": ("cli", "sandbox", "llm"),
    "test_fault_tolerance.py": ("llm",),
    "test_fault_tolerance.py::test_kill_9_mid_batch_then_restart_redoes_nothing_finished": ("cli", "prefect"),
    "test_fault_tolerance.py::test_sigterm_during_an_llm_call_stops_promptly_with_state_saved": ("cli", "prefect"),
    "test_fault_tolerance.py::test_torn_last_history_line_is_repaired_on_resume": ("cli",),
    "test_fault_tolerance.py::test_corrupt_history_line_and_state_are_one_line_errors": ("cli",),
    "test_fused_pack.py": (),
    "test_fuzz_boundary.py": (),
    "test_flow.py": ("prefect",),
    "test_flow_overheads.py": (),
    "test_flow.py::test_llm_calls_are_cached_prefect_tasks": ("llm",),
    "test_flow.py::test_llm_cache_false_asks_the_model_on_every_run": ("llm",),
    "test_flows_cases.py": (),
    "test_graph.py": (),
    "test_graph_bounds.py": (),
    "test_graph_census.py": (),
    "test_graph_census.py::test_census_every_overload": ("slow",),
    "test_hostile.py": ("sandbox", "cli"),
    "test_interrupt.py": (),
    "test_io_compare.py": (),
    "test_isolation.py": ("sandbox",),
    "test_isolation.py::test_cli_refuses_model_source_without_isolation": ("cli",),
    "test_kernel_profile.py": (),
    "test_knowledge_cli.py": ("cli",),
    "test_knowledge_concurrent.py": ("slow", "cli", "llm"),
    "test_knowledge_cli.py::test_papers_through_an_endpoint_then_replayed": ("llm",),
    "test_knowledge_cli.py::test_ingest_as_a_prefect_flow": ("prefect",),
    "test_knowledge_config.py": (),
    "test_knowledge_minilm.py": (),
    "test_knowledge_minilm.py::test_knowledge_search_imports_no_torch": ("cli",),
    "test_knowledge_minilm.py::test_a_missing_model_package_stops_the_search_in_one_line": ("cli",),
    "test_knowledge_reader.py": ("llm",),
    "test_knowledge_store.py": (),
    "test_knowledge_tree.py": (),
    "test_library_mutants.py": (),
    "test_lifecycle.py": ("cli",),
    "test_lifecycle.py::test_a_search_builds_each_part_once_and_opens_its_run_dir_once": ("cli", "prefect"),
    "test_llm_cases.py": ("llm",),
    "test_llm_client.py": ("llm",),
    "test_llm_terminal.py": ("llm",),
    "test_llm_local.py": ("llm",),
    "test_llm_prefect.py": ("llm", "prefect"),
    "test_llm_prompt_cache_summary.py": (),
    "test_llm_scripted.py": ("llm",),
    "test_macro.py": (),
    "test_markers.py": (),
    "test_modtree.py": (),
    "test_mutation_tool.py": (),
    "test_nader_agents.py": ("llm",),
    "test_nader_e2e.py": ("cli", "llm"),
    "test_nader_strategy.py": ("llm",),
    "test_nb201_arch.py": (),
    "test_pareto.py": (),
    "test_plots.py": (),
    "test_prefect_artifacts.py": ("prefect",),
    "test_prefect_artifacts.py::test_search_publishes_report_top_trials_and_progress": ("cli",),
    "test_prefect_artifacts.py::test_progress_follows_each_batch": ("cli",),
    "test_prefect_artifacts.py::test_serve_warns_when_the_ui_calls_another_api": ("cli",),
    "test_prefect_artifacts.py::test_a_deployment_run_holds_its_artifacts_and_has_one_name": ("cli",),
    "test_prefect_database.py": (),
    "test_prefect_database.py::test_nas_search_on_a_damaged_database_fails_at_once_and_leaves_no_run_dir": ("cli",),
    "test_prefect_database.py::test_knowledge_ingest_as_a_flow_on_a_damaged_database_fails_at_once": ("cli",),
    "test_readme_commands.py": ("cli", "prefect"),
    "test_reproduce_page.py": (),
    "test_docker_build.py": (),
    "test_docs.py": ("cli",),  # mkdocs build --strict runs `nas COMMAND --help` for the CLI reference
    "test_docs.py::test_readme_is_short_and_links_to_pages_that_exist": (),
    "test_regression.py": (),
    "test_regression_cases.py": (),
    "test_released_autoformer.py": (),
    "test_released_checkpoints.py": (),
    "test_released_checkpoints.py::test_cli_search_with_a_released_file_of_another_width_scores_nothing": ("cli",),
    "test_released_checkpoints.py::test_cli_search_scores_subnets_with_a_zoo_file_as_written": ("cli", "slow"),
    "test_released_ofa.py": (),
    "test_released_spos.py": (),
    "test_regression.py::test_cli_bad_input_exits_2_with_one_line": ("cli",),
    "test_regression.py::test_cli_smoke_suite_against_committed_and_tampered_baselines": ("cli",),
    "test_regression.py::test_flow_fails_on_regression": ("prefect",),
    "test_rundir_integrity.py": (),
    "test_rundir_integrity.py::test_two_nas_searches_on_one_run_dir": ("cli",),
    "test_runners.py": (),
    "test_runners.py::test_dask_search_matches_the_other_runners_and_fills_the_cache": ("cli", "llm", "prefect"),
    "test_sandbox.py": ("sandbox",),
    "test_sandbox_mutants.py": (),
    "test_sandbox_tables.py": (),
    "test_sandbox_graph_tables.py": (),
    "test_sandbox_worker_inprocess.py": (),
    "test_sandbox_mutants.py::test_a_colour_model_that_cannot_be_exported_is_measured_in_the_child_on_grey_data_made_rgb":
        ("sandbox",),
    "test_sandbox_mutants.py::test_a_failed_verdict_is_never_handed_to_training": ("sandbox",),
    "test_sandbox_fast.py": ("sandbox",),
    "test_screening.py": (),
    "test_screening.py::test_works_with_an_llm_strategy_asking_n_times_factor": ("llm",),
    "test_search_loop.py": (),
    "test_secrets.py": (),
    "test_secrets.py::test_hydra_sweep_lines_show_their_tab_as_spaces": ("cli",),
    "test_secrets.py::test_reply_that_echoes_the_key_is_stored_and_sent_on_scrubbed": ("llm",),
    "test_secrets.py::test_llm_error_message_with_the_key_is_scrubbed": ("llm",),
    "test_secrets.py::test_llm_search_run_files_and_prompts_never_hold_the_key": ("llm",),
    "test_serve.py": ("prefect",),
    "test_serve.py::test_list_shows_full_names_and_schedules": ("cli",),
    "test_serve.py::test_serve_fails_in_one_line": ("cli",),
    "test_serve.py::test_serve_runs_a_deployment_against_a_real_server": ("cli",),
    "test_space_autoformer.py": (),
    "test_space_ofa_mbv3.py": (),
    "test_space_spos.py": (),
    "test_predictor.py": (),
    "test_strategies.py": (),
    "test_optuna_strategy.py": (),
    "test_optuna_strategy.py::test_cli_kill_9_then_the_same_command_resumes_with_no_repeat_to_the_budget": ("cli",),
    "test_optuna_strategy.py::test_peers_benchmark_small_run_pairs_the_default_with_each_method": ("slow",),
    "test_peers_benchmarks.py": (),
    "test_peers_benchmarks.py::test_only_merges_a_new_row_into_an_earlier_json_and_pairs_it_with_a_rerun_default":
        ("slow",),
    "test_peers_benchmarks.py::test_peers_supernet_trains_once_then_compares_the_default_with_each_method":
        ("slow", "cli"),
    "test_design_strategy.py": ("llm", "sandbox"),
    "test_design_verifiers.py": (),
    "test_design_verifiers.py::test_source_chain": ("sandbox",),
    "test_space_contract.py": (),
    "test_strategy_contract.py": (),
    "test_strategy_mutants.py": (),
    "test_strategy_mutants.py::test_llm_calls_as_prefect_tasks_cache_hits_say_so_and_uncached_calls_leave_nothing":
        ("prefect",),
    "test_strategy_mutants.py::test_an_evaluation_task_that_raised_is_a_failed_trial_saying_why":
        ("prefect",),
    "test_strategy_mutants.py::test_evaluations_as_prefect_tasks_come_back_by_ticket_and_a_ticket_runs_once":
        ("prefect",),
    "test_evaluator_contract.py": (),
    "test_evaluators_cases.py": (),
    "test_trial_record.py": (),
    "test_layering.py": (),
    "test_supernet_eval_bench.py": (),
    "test_supernet_imagenet_e2e.py": ("slow", "cli", "prefect"),
    "test_supernet_nb201.py": (),
    "test_supernet_ranking.py": (),
    "test_supernet_ranking.py::test_tiny_run_writes_every_key_the_issue_asks_for": ("slow",),
    "test_supernet_scoring.py": (),
    "test_supernet_train.py": (),
    "test_supernet_train.py::test_cli_trains_a_supernet_then_searches_with_it": ("cli",),
    "test_supernets_cases.py": (),
    "test_plugins.py": ("cli", "slow"),
    "test_proxies.py": (),
    "test_proxies_cases.py": (),
    "test_proxies.py::test_model_source_gets_its_proxies_from_the_exported_graph": ("sandbox",),
    "test_status.py": (),
    "test_table_evaluator.py": (),
    "test_train.py": (),
    "test_trusted_side.py": (),
    "test_protocol.py": (),
    "test_terminal_safe.py": (),
    "test_terminal_safe.py::test_prefect_artifact_tables_escape_encodings_and_metric_text": ("prefect",),
    "test_terminal_safe.py::test_the_cli_prints_one_plain_line_per_hostile_file_on_any_terminal": ("sandbox", "cli",
                                                                                                   "slow"),
    "test_top_cases.py": (),
    "test_trusted_worker.py": (),
    "test_trusted_worker.py::test_a_kept_verdict_vouches_for_no_other_graph": ("sandbox", "slow"),
    "test_trusted_worker.py::test_model_source_a_proxy_cannot_run_gets_one_warning_no_proxies_and_trains":
        ("sandbox",),
    "test_train_e2e.py": ("cli",),
    "test_train_e2e.py::test_train_search_writes_run_files_and_replays_from_cache": ("prefect",),
    "test_train_eval.py": (),
    "test_train_eval.py::test_model_source_trains_in_the_sandbox_per_seed": ("sandbox",),
    "test_train_eval.py::test_model_source_failing_only_in_training_is_reported_where": ("sandbox",),
    "test_train_eval.py::test_model_source_writing_while_training_stays_contained": ("sandbox",),
    "test_train_fast.py": (),
    "test_train_progress.py": (),
    "test_train_progress.py::test_training_in_a_flow_publishes_one_progress_artifact_per_candidate": ("prefect",),
    "test_unknown_keys.py": (),
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        file = item.path.name
        for key in (file, f"{file}::{getattr(item, 'originalname', item.name)}"):
            for marker in MARKERS.get(key, ()):
                item.add_marker(marker)


# A migrated Prefect database, made once per session (each xdist worker) and copied into the homes
# of tests that start `nas` on Prefect: Prefect's migrations of a fresh database are about half the
# ephemeral server's start-up, and no such test checks them (the in-process `prefect_home` tests
# and `make run` still migrate a fresh home).
_PREFECT_DB = Path(os.environ["NASFLOW_HOME"]) / "prefect-template.db"
_MAKE_PREFECT_DB = """
import asyncio
from tasks.env import configure_prefect_env
configure_prefect_env()
from prefect.server.database import provide_database_interface
asyncio.run(provide_database_interface().create_db())
"""


def seed_prefect_db(prefect_home: Path) -> None:
    """Give `prefect_home` (a PREFECT_HOME not yet used; NASFLOW_HOME/prefect for `nas`) the
    migrated Prefect database."""
    if not _PREFECT_DB.is_file():
        home = Path(tempfile.mkdtemp(dir=_PREFECT_DB.parent))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
        env["NASFLOW_HOME"] = str(home)
        subprocess.run([sys.executable, "-c", _MAKE_PREFECT_DB], env=env, check=True, timeout=300,
                       capture_output=True)
        made = home / "prefect" / "prefect.db"
        with sqlite3.connect(made) as db:  # fold the write-ahead log in: one file to copy
            db.execute("PRAGMA journal_mode=DELETE")
        db.close()
        made.rename(_PREFECT_DB)  # only a complete template is ever there
    prefect_home.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_PREFECT_DB, prefect_home / "prefect.db")


@pytest.fixture
def nas_env(tmp_path: Path, request: pytest.FixtureRequest) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env["NASFLOW_HOME"] = str(tmp_path / "nasflow-home")
    if request.node.get_closest_marker("prefect"):
        seed_prefect_db(tmp_path / "nasflow-home" / "prefect")
    env["PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS"] = "180"
    env["PYTHONUNBUFFERED"] = "1"
    return env


@pytest.fixture
def prefect_home(tmp_path: Path):
    """In-process Prefect (ephemeral server) in a home of its own."""
    saved = dict(os.environ)
    for key in [k for k in os.environ if k.startswith("PREFECT_")]:
        del os.environ[key]
    os.environ["NASFLOW_HOME"] = str(tmp_path / "home")
    from tasks.env import configure_prefect_env

    configure_prefect_env()
    yield tmp_path
    os.environ.clear()
    os.environ.update(saved)


@pytest.fixture(autouse=True)
def _logging_as_it_was():
    """Give back the root and `nas.*` loggers as they were before the test. An in-process
    `nas search` (Hydra's job logging) leaves a level, handlers on streams pytest has since
    closed ("--- Logging error ---") and `nas.progress` at INFO: without this, what a test
    sees in its logs depended on which tests its xdist worker ran before it."""
    def ours() -> dict[str, logging.Logger]:
        return {name: lg for name, lg in logging.Logger.manager.loggerDict.items()
                if isinstance(lg, logging.Logger) and (name == "nas" or name.startswith("nas."))}

    root = logging.getLogger()
    saved = {name: (lg.level, list(lg.handlers), lg.propagate, lg.disabled)
             for name, lg in [("", root), *ours().items()]}
    yield
    for name, lg in [("", root), *ours().items()]:
        level, handlers, propagate, disabled = saved.get(name, (logging.NOTSET, [], True, False))
        for handler in [h for h in lg.handlers if h not in handlers]:
            if type(handler).__module__.startswith("_pytest"):  # pytest's capture of this phase
                continue
            lg.removeHandler(handler)
            handler.close()
        lg.handlers.extend(h for h in handlers if h not in lg.handlers)
        lg.setLevel(level)
        lg.propagate, lg.disabled = propagate, disabled


def space_preset(name: str, data: str = "digits") -> dict:
    """A space preset as `nas search space=<name>` composes it: its interpolations
    (`${data.num_classes}`) resolved against a data group (the default job's)."""
    from omegaconf import OmegaConf

    conf = ROOT / "conf"
    cfg = OmegaConf.create({"space": OmegaConf.load(conf / "space" / f"{name}.yaml"),
                            "data": OmegaConf.load(conf / "data" / f"{data}.yaml")})
    return OmegaConf.to_container(cfg, resolve=True)["space"]  # type: ignore[index]


def run_nas(args: list[str], env: dict[str, str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([*NAS, *args], env=env, cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
