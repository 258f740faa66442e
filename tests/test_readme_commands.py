"""Every `nas` command in README.md's fenced code blocks runs as written, so the README
cannot rot: each is either in RUN (run with the real CLI from a temp cwd and a temp
NASFLOW_HOME, placeholders filled from earlier commands, only documented tiny-budget
overrides appended) or in SKIP with the reason it cannot run here. A README command in
neither, or a table entry the README no longer has, fails the fast test below."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import NAS, ROOT, seed_prefect_db

FASHION = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class Run:
    """How a README command runs: `args` replaces the README's arguments when it has
    placeholders ({name}: a path from the context), `append` adds tiny-budget overrides."""
    args: str | None = None
    append: str = ""
    needs: tuple[Path, ...] = ()
    checks: tuple[str, ...] = field(default=())  # names of CHECKS to apply to the result


RUN: dict[str, Run] = {
    # [hydra overrides] -> a space alone: its natural strategy (rea) and evaluator (table), on Prefect.
    "nas search [hydra overrides]": Run(args="search space=nb201 budget.trials=3", checks=("run_dir", "search_log")),
    "nas search -m space=nb201 evaluator=table strategy=random,rea seed=0,1,2,3,4":
        Run(append="runner=local budget.trials=2", checks=("sweep",)),
    "nas compare DIR... [--baseline random] [--at 25 50 100]": Run(args="compare {sweep} --baseline random --at 1 2"),
    "nas export RUN_DIR [--out DIR]": Run(args="export {run_dir} --out {tmp}/export"),
    "nas arch validate FILE...": Run(args="arch validate tests/data/blocks/residual.txt tests/data/blocks/shuffle_se.txt"),
    "nas arch show FILE [--json]": Run(args="arch show tests/data/blocks/residual.txt --json"),
    "nas arch draw FILE -o g.png": Run(args="arch draw tests/data/blocks/residual.txt -o g.png"),
    "nas knowledge ingest": Run(),
    'nas knowledge search "channel attention" [--main-category "adaptive feature recalibration"] [-k 5] [--json]':
        Run(args='knowledge search "channel attention" --main-category "adaptive feature recalibration" -k 5 --json'),
    "nas knowledge stats [--json] [--plot stats.png]": Run(args="knowledge stats --json --plot stats.png"),
    "nas knowledge tree [--build]": Run(args="knowledge tree"),
    "nas train-supernet space=spos_small data=fashion_mnist supernet.epochs=2 out=runs/sn_spos":
        Run(append="supernet.epochs=1 supernet.train_subset=256 supernet.val_subset=128", needs=(FASHION,)),
    "nas search space=spos_small data=fashion_mnist evaluator=supernet evaluator.checkpoint=runs/sn_spos/supernet.pt "
    "strategy=evolution constraint.flops=2e7 budget.trials=100 runner=local":
        Run(append="budget.trials=2 evaluator.val_subset=128 evaluator.recal_batches=1", needs=(FASHION,)),
    "nas search space=nb201 evaluator=train data=fashion_mnist recipe=cpu_proxy budget.trials=10 "
    "evaluator.channels=8 evaluator.cells_per_stage=1":
        Run(append="budget.trials=1 recipe.epochs=1 recipe.train_subset=512 recipe.valid_subset=256 "
                   "recipe.test_subset=256 runner=local", needs=(FASHION,)),
    "nas train tests/data/blocks/residual.txt data=digits recipe.epochs=3 evaluator.cells_per_stage=1":
        Run(append="recipe.epochs=1"),
    "nas search -m +experiment=ablation": Run(append="budget.trials=2 seed=0", checks=("ablation",)),
    "nas search -m +experiment=ablation strategy=random,rea seed=0,1,2,3,4,5": Run(append="budget.trials=2"),
    "nas compare multirun/<time> --baseline random [--at 25 50 100] [--band std|iqr] [--out DIR] [--allow-mixed]":
        Run(args="compare {ablation} --baseline random --at 1 2 --band iqr --out {tmp}/cmp"),
    "nas serve --list": Run(),
    "nas serve --file my_prefect.yaml": Run(append="--list"),  # a copy of the repo's prefect.yaml
    "nas serve nightly-regression.cron='0 4 * * *' design-search=null": Run(append="--list"),
    "nas regress --suite smoke": Run(append="--out {tmp}/regress"),
}

SYNOPSIS = "a synopsis whose concrete forms are run: "
SKIP: dict[str, str] = {
    "make run": "CI: the default NADER job with the embedded LLM (`nas search`, minutes)",
    "make test": "CI: .ci/run runs it",
    "nas regress [--suite smoke|nightly]": SYNOPSIS + "nas regress --suite smoke",
    "nas train ARCH [--out R.json] [overrides]": SYNOPSIS + "nas train tests/data/blocks/residual.txt",
    "nas train-supernet [out=DIR] [overrides]": SYNOPSIS + "nas train-supernet space=spos_small",
    "nas knowledge ingest|search|tree|stats": SYNOPSIS + "nas knowledge ingest, search, stats, tree",
    "nas serve": "serves until Ctrl-C; tests/test_serve.py runs it against a real Prefect server",
    "nas regress": "the nightly suite, 5-10 min on 2 cores (the served nightly-regression flow runs it)",
    "nas regress --suite nightly --update-baseline": "minutes, and rewrites nas/regression/baselines/nightly.json",
    "nas regress llm=openai llm.base_url=...": "needs an OpenAI-compatible endpoint (the URL is a placeholder)",
    "nas knowledge ingest papers/ more.pdf list.jsonl": "the reader's own papers, read by an LLM; "
                                                        "tests/test_knowledge_cli.py ingests files via a scripted LLM",
    "nas knowledge ingest papers/ --prefect": "the reader's own papers; tests/test_knowledge_cli.py runs --prefect",
    "nas knowledge ingest ../shared/data/nader/inspirations.json": "needs NADER's data in ../shared/data",
    "nas knowledge ingest ../shared/data/nader/*_experience.json": "needs NADER's data in ../shared/data",
    "nas search space=ofa_mbv3_small data=fashion_mnist evaluator=supernet evaluator.checkpoint=... strategy=collm":
        "needs a trained ofa_mbv3_small supernet (the checkpoint is a placeholder) and minutes of LLM calls",
    "nas search space=nb201 evaluator=table strategy=collm budget.trials=100":
        "minutes of the embedded LLM on 2 cores; tests/test_collm.py runs CoLLM on the table through a scripted LLM",
    "nas train model.py data=fashion_mnist engine=fast 'evaluator.seeds=[777,888,999]' --out result.json":
        "model.py is the reader's model; three sandboxed trainings on Fashion-MNIST take minutes; "
        "tests/test_train_e2e.py runs `nas train` on a model file",
    "nas search runner=dask runner.address=tcp://HEAD:8786 runner.per_gpu=1":
        "needs a Dask scheduler at HEAD; tests/test_cluster_dask.py evaluates via a local scheduler's address",
    "nas search runner=ray runner.address=HEAD:6379 runner.per_gpu=2 runner.max_retries=2":
        "needs a Ray head at HEAD; tests/test_cluster_ray.py evaluates on a real local Ray",
}


def readme_commands() -> list[str]:
    """`nas`/`make` lines of README.md's fenced code blocks (comments cut, continuations joined), once each."""
    commands, block, pending = [], False, ""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("```"):
            block = not block
            continue
        if not block:
            continue
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1].strip() + " "
            continue
        pending = ""
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        if re.match(r"(nas|make) ", command) or command in ("nas", "make"):
            commands.append(command)
    return list(dict.fromkeys(commands))  # `nas serve` is in two blocks


def test_every_readme_command_is_run_or_listed_with_a_reason():
    commands = readme_commands()
    unlisted = [c for c in commands if c not in RUN and c not in SKIP]
    assert not unlisted, f"README commands neither run nor listed in SKIP: {unlisted}"
    stale = [c for c in [*RUN, *SKIP] if c not in commands]
    assert not stale, f"entries for commands no longer in the README: {stale}"
    assert not set(RUN) & set(SKIP)
    for command, reason in SKIP.items():  # a synopsis points at commands that do run
        if reason.startswith(SYNOPSIS):
            for form in reason[len(SYNOPSIS):].split(", "):
                head = form if form.startswith("nas ") else f"nas knowledge {form}"
                assert any(c.startswith(head) for c in RUN), (command, form)


def _argv(command: str, spec: Run, ctx: dict[str, str]) -> list[str]:
    text = spec.args if spec.args is not None else command.removeprefix("nas ")
    return shlex.split(f"{text} {spec.append}".format(**ctx))


def _run_dirs(stdout: str) -> list[Path]:
    return [Path(line.removeprefix("run dir: ")) for line in stdout.splitlines() if line.startswith("run dir: ")]


@pytest.fixture(scope="session")
def readme_runs(tmp_path_factory) -> dict[str, subprocess.CompletedProcess | str]:
    """Run every RUN command once, in README order, from one temp cwd (later commands use
    earlier outputs: DIR, RUN_DIR, runs/sn_spos); a command whose data is missing is a str."""
    cwd = tmp_path_factory.mktemp("readme")
    (cwd / "tests").symlink_to(ROOT / "tests")  # README paths are relative to a checkout
    shutil.copy(ROOT / "prefect.yaml", cwd / "my_prefect.yaml")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "HYDRA_"))}
    env.update(NASFLOW_HOME=str(cwd / "home"), PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180")
    seed_prefect_db(cwd / "home" / "prefect")
    ctx = {"tmp": str(cwd)}
    results: dict[str, subprocess.CompletedProcess | str] = {}
    for command in (c for c in readme_commands() if c in RUN):
        spec = RUN[command]
        missing = [str(p) for p in spec.needs if not p.exists()]
        if missing:
            results[command] = f"needs {', '.join(missing)}"
            continue
        try:
            argv = _argv(command, spec, ctx)
        except KeyError as err:  # the command that provides it failed
            results[command] = f"no {err} from an earlier command"
            continue
        out = subprocess.run([*NAS, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
        results[command] = out
        dirs = _run_dirs(out.stdout)
        if out.returncode == 0 and dirs:
            ctx.setdefault("run_dir", str(dirs[0]))
            if "-m" in argv:
                ctx["ablation" if "+experiment=ablation" in argv else "sweep"] = str(dirs[0].parent)
    return results


def _check_run_dir(out: subprocess.CompletedProcess) -> None:
    run_dir = _run_dirs(out.stdout)[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    assert (summary["strategy"], summary["evaluator"], summary["runner"]) == ("rea", "table", "prefect")


def _check_search_log(out: subprocess.CompletedProcess) -> None:
    log = (_run_dirs(out.stdout)[0] / "search.log").read_text()
    assert "[nas.progress][INFO] - trial 3/3, best " in log, log


def _check_sweep(out: subprocess.CompletedProcess) -> None:
    runs = _run_dirs(out.stdout)
    assert len(runs) == 10 and {json.loads((r / "summary.json").read_text())["trials"] for r in runs} == {2}


def _check_ablation(out: subprocess.CompletedProcess) -> None:
    runs = _run_dirs(out.stdout)
    assert sorted(json.loads((r / "summary.json").read_text())["strategy"] for r in runs) == \
        ["evolution", "random", "rea", "reinforce"]


CHECKS = {"run_dir": _check_run_dir, "search_log": _check_search_log, "sweep": _check_sweep,
          "ablation": _check_ablation}


@pytest.mark.slow
@pytest.mark.parametrize("command", list(RUN))
def test_readme_command_runs_as_written(command, readme_runs):
    out = readme_runs[command]
    if isinstance(out, str):
        pytest.skip(out)
    assert out.returncode == 0, f"{out.args}\n{out.stderr[-3000:]}"
    for name in RUN[command].checks:
        CHECKS[name](out)


def test_readme_python_imports_resolve():
    """The README's Python examples import names that exist (a stale import fails as written)."""
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    imports = [line for block in blocks for line in block.splitlines() if line.startswith(("from ", "import "))]
    assert imports
    for line in imports:
        exec(line, {})  # noqa: S102 - the README's own import lines
