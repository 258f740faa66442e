"""One `nas search` job run as `@hydra.main` runs it (the run dir, Hydra's and the job's logging,
HydraConfig, a bug's trace through `run_and_report`), on the config the command's checks
composed (nas.config.checked_job). Hydra's main would compose it twice more, once to read
`hydra.mode` and once to run: a tenth of a CPU-second each before the first trial.
Written against hydra-core 1.3 (pinned): hydra/_internal/hydra.py `Hydra.run`."""

from __future__ import annotations

from typing import Any, Callable

from hydra._internal.callbacks import Callbacks
from hydra._internal.hydra import Hydra
from hydra._internal.utils import create_automatic_config_search_path, run_and_report
from hydra.core.global_hydra import GlobalHydra
from hydra.core.utils import configure_log, run_job
from hydra.types import HydraContext, RunMode

CONFIG_NAME = "config"
TASK_NAME = "search"  # what `@hydra.main` names the job from nas/cli/search.py's task function


def plain_run(config: Any) -> bool:
    """Whether `run_composed` runs this config as Hydra's main would: one job (no config file asks
    for a sweep) and no `hydra.verbose` (whose debug lines Hydra's main prints as it composes)."""
    return config.hydra.mode is None and not config.hydra.verbose


def run_composed(config: Any, task: Callable[[Any], None]) -> None:
    """`task` on `config` (with its `hydra` node; `plain_run`), as `Hydra.run` calls it after its compose."""
    # as Hydra's main: hydra.mode=RUN among the overrides it records when no config chose a mode
    config.hydra.mode = RunMode.RUN
    config.hydra.overrides.hydra.append("hydra.mode=RUN")
    search_path = create_automatic_config_search_path(None, None, "pkg://conf")
    hydra = run_and_report(lambda: Hydra.create_main_hydra2(task_name=TASK_NAME, config_search_path=search_path))

    def run() -> None:
        configure_log(config.hydra.hydra_logging, config.hydra.verbose)
        callbacks = Callbacks(config)
        callbacks.on_run_start(config=config, config_name=CONFIG_NAME)
        ret = run_job(hydra_context=HydraContext(config_loader=hydra.config_loader, callbacks=callbacks),
                      task_function=task, config=config, job_dir_key="hydra.run.dir", job_subdir_key=None,
                      configure_logging=True)
        callbacks.on_run_end(config=config, config_name=CONFIG_NAME, job_return=ret)
        _ = ret.return_value  # raises the task's exception, which run_and_report prints as Hydra's main does

    try:
        run_and_report(run)
    finally:
        GlobalHydra.instance().clear()
