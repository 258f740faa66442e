"""Every `nas` command in the fenced code blocks of README.md and of the docs site's pages
(docs/**/*.md) runs as written, so neither can rot: each is either in RUN (run with the real
CLI from a temp cwd and a temp NASFLOW_HOME, placeholders filled from earlier commands, only
documented tiny-budget overrides appended) or in SKIP with the reason it cannot run here. A
command in neither, or a table entry no page has any more, fails the fast test below. Where a
page shows a command's output (a ```console block) and the command runs as written, the lines
shown must be what it prints (CHECKS["shown"])."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import NAS, ROOT, seed_prefect_db
from support.scripted import ScriptedServer

FASHION = Path("/usr/share/datasets/fashion-mnist")


@dataclass(frozen=True)
class Run:
    """How a README command runs: `args` replaces the README's arguments when it has
    placeholders ({name}: a path from the context), `append` adds tiny-budget overrides."""
    args: str | None = None
    append: str = ""
    needs: tuple[Path, ...] = ()
    checks: tuple[str, ...] = field(default=())  # names of CHECKS to apply to the result
    first: bool = False  # run before the others (the store that later commands read)
    sweep: bool = True  # a multirun's folder becomes {sweep} (or {ablation}) for later commands


RUN: dict[str, Run] = {
    # README's tour, as written where it is cheap (its shown output is checked too: SHOWN).
    "nas search space=nb201 strategy=random budget.trials=20": Run(checks=("shown",)),
    "nas search -m space=nb201 strategy=random,rea seed=0,1,2 budget.trials=50 runner=local":
        Run(args="search -m space=nb201 strategy=random,rea seed=0,1,2 budget.trials=3 runner=local"),
    "nas compare multirun/<time> --baseline random": Run(args="compare {sweep} --baseline random --out {tmp}/tour-cmp"),
    "nas arch validate tests/data/blocks/residual.txt tests/data/blocks/shuffle_se.txt": Run(checks=("shown",)),
    "nas export runs/<time>_nb201_random_s0": Run(args="export {run_dir} --out {tmp}/tour-export"),
    'nas knowledge search "channel attention" -k 3': Run(checks=("shown",)),
    # a space alone: its natural strategy and evaluator (conf/space_defaults/nb201.yaml), on Prefect.
    "nas search space=nb201 budget.trials=100": Run(args="search space=nb201 budget.trials=3",
                                                    checks=("run_dir", "search_log")),
    "nas search -m space=nb201 evaluator=table strategy=random,rea seed=0,1,2,3,4":
        Run(append="runner=local budget.trials=2", checks=("sweep",)),
    "nas compare DIR... [--baseline random] [--at 25 50 100]": Run(args="compare {sweep} --baseline random --at 1 2"),
    "nas arch validate FILE...": Run(args="arch validate tests/data/blocks/residual.txt tests/data/blocks/shuffle_se.txt"),
    "nas arch show FILE [--json]": Run(args="arch show tests/data/blocks/residual.txt --json"),
    "nas arch draw FILE -o g.png": Run(args="arch draw tests/data/blocks/residual.txt -o g.png"),
    "nas knowledge ingest": Run(first=True),
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
    "nas export RUN_DIR [--out DIR]": SYNOPSIS + "nas export runs/<time>_nb201_random_s0",  # an ONNX export: ~40 s
    "nas serve": "serves until Ctrl-C; tests/test_serve.py runs it against a real Prefect server",
    "nas ui": "starts the shared local server (the tests use temporary ones); tests/test_shared_server.py runs it "
              "with port 4200 taken",
    "nas regress": "the nightly suite, 5-10 min on 2 cores (the served nightly-regression flow runs it)",
    "nas regress --suite nightly --update-baseline": "minutes, and rewrites nas/regression/baselines/nightly.json",
    "nas knowledge ingest papers/ more.pdf list.jsonl": "the reader's own papers, read by an LLM; "
                                                        "tests/test_knowledge_cli.py ingests files via a scripted LLM",
    "nas knowledge ingest papers/ --prefect": "the reader's own papers; tests/test_knowledge_cli.py runs --prefect",
    "nas search space=ofa_mbv3_small data=fashion_mnist evaluator=supernet evaluator.checkpoint=... strategy=collm":
        "needs a trained ofa_mbv3_small supernet (the checkpoint is a placeholder) and minutes of LLM calls",
    "nas search space=nb201 evaluator=table strategy=collm budget.trials=100":
        "minutes of the embedded LLM on 2 cores; tests/test_collm.py runs CoLLM on the table through a scripted LLM",
    "nas search runner=dask runner.address=tcp://HEAD:8786 runner.per_gpu=1":
        "needs a Dask scheduler at HEAD; tests/test_cluster_dask.py evaluates via a local scheduler's address",
    "nas search runner=ray runner.address=HEAD:6379 runner.per_gpu=2 runner.max_retries=2":
        "needs a Ray head at HEAD; tests/test_cluster_ray.py evaluates on a real local Ray",
}


# Tiny stand-ins for what docs/reproduce.md's and the released-supernet pages' commands read: a
# 1,000-class ImageFolder, the released checkpoints in their projects' formats (random weights, full
# size), NB201's datasets in their formats. Written once, by the fixture, when a command needs one.
IMAGENET_RUN = "evaluator.val_subset=2 evaluator.recal_batches=1 evaluator.batch_size=2 runner=local"
COLLM_RUN = f"budget.trials=2 strategy.candidates_per_iteration=2 {IMAGENET_RUN}"
NB201_RUN = ("budget.trials=1 recipe.epochs=1 'evaluator.seeds=[0]' evaluator.channels=4 evaluator.cells_per_stage=1 "
             "'evaluator.proxies=[]' runner=local")  # proxies: tests/test_trusted_worker.py scores them


def write_inputs(root: Path) -> dict[str, str]:
    """{placeholder: path} of the inputs above, written under `root`."""
    from support.imagefolder import write_folder
    from support.nb201_data import write_nb201_data
    from support.released import official_spos, official_tensors, save_release, write_ofa_zoo, write_spos

    root.mkdir()
    paths = {"imagenet": write_folder(root / "imagenet", 1000, train=1, val=1, size=(24, 20)),
             "nb201_data": write_nb201_data(root / "data"),
             "ofa_w10": write_ofa_zoo(root / "ofa_mbv3_d234_e346_k357_w1.0", 1.0),
             "ofa_w12": write_ofa_zoo(root / "ofa_mbv3_d234_e346_k357_w1.2", 1.2),
             "spos_ckpt": write_spos(root / "checkpoint-150000.pth.tar", official_spos())}
    for scale in "tsb":
        paths[f"autoformer_{scale}"] = save_release(root / f"supernet-{scale}.pth", official_tensors(f"autoformer_{scale}"))
    return {k: str(v) for k, v in paths.items()}


# The pages' LLM endpoint (an OpenAI-compatible server) is the scripted one on loopback: its replies
# are no model's, so CoLLM's Coordinator fills with random subnets, through the real client path.
SCRIPTED_REPLY = "Favour deeper stages and larger kernels late in the network."


def _collm(space: str, checkpoint: str, limit: str) -> Run:
    """A CoLLM-NAS command of docs/reproduce.md at tiny settings: one seed, two subnets."""
    return Run(args=f"search -m space={space} strategy=collm evaluator=supernet evaluator.checkpoint={{{checkpoint}}} "
                    f"data=imagenet data.root={{imagenet}} {limit} seed=0 {COLLM_RUN} "
                    "llm=openai llm.base_url={llm_url} llm.model=Qwen3-30B-A3B", checks=("two_trials",), sweep=False)


def _nb201(space: str, strategy: str, data: str, split: str) -> Run:
    """A NADER/FairNAD command of docs/reproduce.md at tiny settings: the base design, one epoch."""
    return Run(args=f"search space={space} strategy={strategy} evaluator=train data={data} data.root={{nb201_data}} "
                    f"data.split_file={{nb201_data}}/{split} recipe=nb201 {NB201_RUN} "
                    "llm=openai llm.base_url={llm_url} llm.model=gpt-4o")


LLM = "llm=openai llm.base_url=http://127.0.0.1:8000/v1 llm.model=Qwen3-30B-A3B"
RUN.update({
    "nas search space=ofa_mbv3 evaluator=supernet evaluator.checkpoint=ofa_mbv3_d234_e346_k357_w1.0 data=imagenet "
    "data.root=/data/imagenet":
        Run(args="search space=ofa_mbv3 evaluator=supernet evaluator.checkpoint={ofa_w10} data=imagenet "
                 f"data.root={{imagenet}} budget.trials=2 {IMAGENET_RUN}"),
    "nas search space=ofa_mbv3 strategy=random evaluator=supernet "
    "evaluator.checkpoint=~/.torch/ofa_nets/ofa_mbv3_d234_e346_k357_w1.2 data=imagenet data.root=/data/imagenet":
        Run(args="search space=ofa_mbv3 strategy=random evaluator=supernet evaluator.checkpoint={ofa_w12} "
                 f"data=imagenet data.root={{imagenet}} budget.trials=2 {IMAGENET_RUN}"),
    "nas search space=autoformer_t strategy=evolution evaluator=supernet "
    "evaluator.checkpoint=~/Downloads/supernet-tiny.pth data=imagenet data.root=/data/imagenet":
        Run(args="search space=autoformer_t strategy=evolution evaluator=supernet evaluator.checkpoint={autoformer_t} "
                 f"data=imagenet data.root={{imagenet}} budget.trials=2 {IMAGENET_RUN}"),
    "nas search -m space=ofa_mbv3 strategy=collm evaluator=supernet "
    "evaluator.checkpoint=~/.torch/ofa_nets/ofa_mbv3_d234_e346_k357_w1.0 data=imagenet data.root=/data/imagenet "
    f"constraint.flops=2e8,3e8,4e8,5e8 seed=0,1,2 budget.trials=250 strategy.candidates_per_iteration=10 {LLM}":
        _collm("ofa_mbv3", "ofa_w10", "constraint.flops=3e8"),
    "nas search -m space=spos strategy=collm evaluator=supernet evaluator.checkpoint=~/Downloads/checkpoint-150000.pth.tar "
    "data=imagenet data.root=/data/imagenet constraint.flops=3.3e8 seed=0,1,2 budget.trials=250 "
    f"strategy.candidates_per_iteration=10 {LLM}":
        _collm("spos", "spos_ckpt", "constraint.flops=3.3e8"),
    **{f"nas search -m space=autoformer_{s} strategy=collm evaluator=supernet "
       f"evaluator.checkpoint=~/Downloads/supernet-{size}.pth data=imagenet data.root=/data/imagenet "
       f"constraint.params={limit} seed=0,1,2 budget.trials=250 strategy.candidates_per_iteration=10 {LLM}":
       _collm(f"autoformer_{s}", f"autoformer_{s}", f"constraint.params={limit}")
       for s, size, limit in (("t", "tiny", "6e6"), ("s", "small", "2.3e7"), ("b", "base", "5.4e7"))},
    **{f"nas search space={space} strategy={strategy} evaluator=train data={data} data.root=/data "
       f"data.split_file=/data/{split} recipe=nb201 'evaluator.seeds=[777,888,999]' budget.trials=500 "
       "llm=openai llm.model=gpt-4o": _nb201(space, strategy, data, split)
       for space, strategy, data, split in (("nader", "nader", "cifar10", "cifar-split.txt"),
                                            ("nader", "nader", "cifar100", "cifar100-test-split.txt"),
                                            ("nader", "nader", "imagenet16_120", "imagenet-16-120-test-split.txt"),
                                            ("source", "fairnad", "cifar10", "cifar-split.txt"))},
})
INPUTS = re.compile(r"\{(imagenet|nb201_data|ofa_w10|ofa_w12|spos_ckpt|autoformer_[tsb])\}")

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]  # the site's pages as written (not generated ones)


def commands_in(path: Path) -> list[str]:
    """`nas`/`make` lines of a page's fenced code blocks (comments cut, continuations joined); in a
    ```console block only the `$ ` lines, the rest being their output."""
    commands, fence, pending = [], None, ""
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = line[3:].split()[0] if fence is None and line[3:].strip() else (None if fence is not None else "")
            continue
        if fence is None:
            continue
        if fence == "console":
            if not line.startswith("$ ") and not pending:
                continue
            line = line.removeprefix("$ ")
        line = pending + line.strip()
        if line.endswith("\\"):
            pending = line[:-1].strip() + " "
            continue
        pending = ""
        command = re.sub(r"\s+#\s.*$", "", line).strip()
        if re.match(r"(nas|make) ", command) or command in ("nas", "make"):
            commands.append(command)
    return commands


def readme_commands() -> list[str]:
    """The commands of README.md and then of docs/*.md, once each (a command may be on several pages)."""
    return list(dict.fromkeys(c for page in DOCS for c in commands_in(page)))


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
def readme_runs(tmp_path_factory, request) -> dict[str, subprocess.CompletedProcess | str]:
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
    order = [c for c in readme_commands() if c in RUN]
    if any(INPUTS.search(RUN[c].args or "") for c in order):
        ctx.update(write_inputs(cwd / "inputs"))
    llm = ScriptedServer(default=SCRIPTED_REPLY).start()
    request.addfinalizer(llm.stop)
    ctx["llm_url"] = llm.base_url
    for command in sorted(order, key=lambda c: not RUN[c].first):  # stable: page order otherwise
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
        start = time.monotonic()
        out = subprocess.run([*NAS, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False)
        print(f"readme command: {time.monotonic() - start:.1f} s  {command}")  # shown with -s or on failure
        results[command] = out
        dirs = _run_dirs(out.stdout)
        if out.returncode == 0 and dirs:
            ctx.setdefault("run_dir", str(dirs[0]))
            if "-m" in argv and spec.sweep:
                ctx["ablation" if "+experiment=ablation" in argv else "sweep"] = str(dirs[0].parent)
    return results


def _check_run_dir(out: subprocess.CompletedProcess) -> None:
    run_dir = _run_dirs(out.stdout)[0]
    summary = json.loads((run_dir / "summary.json").read_text())
    natural = dict(re.findall(r"^\s*- /(strategy|evaluator): (\w+)", (ROOT / "conf/space_defaults/nb201.yaml").read_text(),
                              re.M))
    assert (summary["strategy"], summary["evaluator"], summary["runner"]) == \
        (natural["strategy"], natural["evaluator"], "prefect")


def _check_search_log(out: subprocess.CompletedProcess) -> None:
    log = (_run_dirs(out.stdout)[0] / "search.log").read_text()
    assert "[nas.progress][INFO] - trial 3/3, best " in log, log


def shown_output(argv: list[str]) -> list[str]:
    """The output lines the pages show under `$ nas ARGV` in ```console blocks."""
    lines, inside, mine = [], False, False
    for page in DOCS:
        for line in page.read_text().splitlines():
            if line.startswith("```"):
                inside, mine = line.strip() == "```console", False
                continue
            if inside and line.startswith("$ "):
                mine = shlex.split(line[2:]) == ["nas", *argv]
            elif inside and mine:
                lines.append(line)
    return lines


def _normal(line: str) -> str:
    """A line without what changes from run to run: timings, the bar's elapsed time, trailing space."""
    return re.sub(r"\d+(\.\d+)?s\b|\d+:\d\d:\d\d", "T", line).rstrip()


def _check_shown(out: subprocess.CompletedProcess) -> None:
    """Each shown line that is not cut (`...`), a path of the machine it ran on, or a progress bar
    is printed by the command (stdout or stderr)."""
    argv = [str(a) for a in out.args[len(NAS):]]
    command = shlex.join(["nas", *argv])
    shown = [_normal(line) for line in shown_output(argv)
             if "..." not in line and "/tmp/" not in line and "━" not in line]
    assert shown, f"no output shown for {command}"
    printed = {_normal(line) for line in (out.stdout + out.stderr).splitlines()}
    missing = [line for line in shown if line not in printed]
    assert not missing, f"{command}: the page shows lines it no longer prints: {missing}\n{out.stdout}{out.stderr}"


def _check_sweep(out: subprocess.CompletedProcess) -> None:
    runs = _run_dirs(out.stdout)
    assert len(runs) == 10 and {json.loads((r / "summary.json").read_text())["trials"] for r in runs} == {2}


def _check_ablation(out: subprocess.CompletedProcess) -> None:
    runs = _run_dirs(out.stdout)
    assert sorted(json.loads((r / "summary.json").read_text())["strategy"] for r in runs) == \
        ["evolution", "random", "rea", "reinforce"]


def _check_two_trials(out: subprocess.CompletedProcess) -> None:
    runs = _run_dirs(out.stdout)
    assert len(runs) == 1 and json.loads((runs[0] / "summary.json").read_text())["trials"] == 2, out.stdout


CHECKS = {"two_trials": _check_two_trials, "run_dir": _check_run_dir, "search_log": _check_search_log, "sweep": _check_sweep,
          "ablation": _check_ablation, "shown": _check_shown}


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the fixture runs every command, ~6 min on 2 idle cores, far more under load
@pytest.mark.parametrize("command", list(RUN))
def test_readme_command_runs_as_written(command, readme_runs):
    out = readme_runs[command]
    if isinstance(out, str):
        pytest.skip(out)
    assert out.returncode == 0, f"{out.args}\n{out.stderr[-3000:]}"
    for name in RUN[command].checks:
        CHECKS[name](out)


def test_readme_python_imports_resolve():
    """The README's and the docs' Python examples import names that exist (a stale import fails as written)."""
    blocks = [b for page in DOCS for b in re.findall(r"^```python\n(.*?)^```", page.read_text(), re.M | re.S)]
    imports = [line for block in blocks for line in block.splitlines() if line.startswith(("from ", "import "))]
    assert imports
    for line in imports:
        exec(line, {})  # noqa: S102 - the README's own import lines
