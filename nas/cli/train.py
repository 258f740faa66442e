"""`nas train ARCH [overrides]`: train one architecture with the search's config groups.

ARCH is a file of a trainable space, by its suffix (a model source `.py`, trained in the
sandbox; a NADER block `.txt`), or an architecture string (an NB201 cell `|nor_conv_3x3~0|+|...`).
Overrides are Hydra's, as for `nas search`: `data=digits recipe.epochs=3 engine=fast
evaluator.seeds=[777,888,999]`.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING

from nas.cli.main import check_group_overrides, fail
from nas.config import check_config
from nas.core.arch import Architecture
from nas.core.trial import SELF_REPORTED, EvalResult
from nas.errors import ConfigError, EncodingError, InputError, MissingDependencyError, NasError
from nas.evaluators import EVALUATORS
from nas.io import atomic_write_json, check_output, read_input_text
from nas.spaces import SPACES
from nas.terminal import printable
from nas.train.progress import EpochDisplay

if TYPE_CHECKING:
    from nas.core.space import SearchSpace

USAGE = "usage: nas train ARCH [--out RESULT.json] [seed=N data=... recipe=... engine=... evaluator.KEY=...]"


def load_arch(spec: str) -> tuple[SearchSpace, Architecture]:
    """ARCH and the trainable space that reads it, asked of the spaces (`SearchSpace.file_suffix`):
    a file by its suffix, anything else as an architecture string of a space whose architectures
    are strings."""
    trainable = [cls for cls in map(SPACES.get, SPACES.names()) if cls.trainable]
    files = {cls.file_suffix: cls.name for cls in trainable if cls.file_suffix}
    strings = [cls.name for cls in trainable if not cls.file_suffix]
    kinds = [*(f"a {suffix} file (space '{name}')" for suffix, name in files.items()),
             *(f"an architecture string (space '{name}')" for name in strings)]
    hint = " or ".join([", ".join(kinds[:-1]), kinds[-1]] if len(kinds) > 1 else kinds)
    path = Path(spec)
    if path.is_dir():
        raise InputError(f"{path}: is a directory, not a file (give {hint})")
    if path.is_file():
        if path.suffix not in files:
            raise EncodingError(f"{path}: no space reads '{path.suffix}' files (give {hint})")
        space = SPACES.create(files[path.suffix], {})
        return space, space.read(read_input_text(path), str(path))
    errors = []
    for name in strings if path.suffix not in files else []:
        space = SPACES.create(name, {})
        try:
            return space, space.read(spec, "ARCH")
        except EncodingError as err:
            errors.append(f"{name}: {err}")
    strings_failed = f", nor an architecture string ({'; '.join(errors)})" if errors else ""
    raise InputError(f"{path}: no such file{strings_failed} (give {hint})")


def compose(overrides: list[str]) -> tuple[dict, int]:
    """The `evaluator=train` config with `data`, `recipe` and `engine` resolved into it, and the seed."""
    cfg = check_config(["evaluator=train", *overrides])
    if type(cfg["seed"]) is not int or cfg["seed"] < 0:  # as a search's (SearchSpec)
        raise ConfigError(f"seed must be an integer >= 0, got {cfg['seed']!r}")
    return cfg["evaluator"], cfg["seed"]


def result_line(arch: Architecture, result: EvalResult) -> str:
    """The one line a training ends with: its state (the model's error quoted, escaped), accuracies,
    size and time."""
    m = result.metrics
    state = "ok" if result.ok else f"failed: {result.error}"
    if m.get("self_reported"):  # trained inside the sandbox: its numbers are its own claim
        state += (f" ({SELF_REPORTED}: the model could not be exported as a graph, so it trained inside "
                  "the sandbox and reported these numbers itself)")
    accuracy = "no accuracy measured"  # a terminated (or unbuilt) network is never evaluated
    if "valid_accuracy" in m:
        accuracy = f"valid {m['valid_accuracy']:.2f}%, test {m['test_accuracy']:.2f}%"
        if not result.ok:  # a seed terminated early: the mean is of those that finished
            accuracy += " (mean of the seeds that finished)"
    return printable(f"{arch.space} {arch.key()}: {state}; {accuracy}, {result.params} params, {result.flops} FLOPs, "
                     f"{m.get('epochs', 0):g} epochs, {result.cost_seconds:.1f} s")  # `state`: the model's error


def main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__.strip() + "\n\n" + USAGE)
        raise SystemExit(0 if argv else 2)
    out, rest = None, list(argv[1:])
    if "--out" in rest:
        i = rest.index("--out")
        if i + 1 == len(rest):
            fail("--out needs a path")
        out = Path(rest.pop(i + 1))
        rest.pop(i)
        try:
            check_output(out)  # before the training, not after it
        except NasError as err:
            fail(str(err))
    check_group_overrides(rest)
    try:
        space, arch = load_arch(argv[0])
        params, seed = compose(rest)
        params.pop("name", None)
        evaluator = EVALUATORS.create("train", params, space=space)  # builds the network
        # a model .py trains in the sandbox, which reports no epochs: the title alone then
        with EpochDisplay(f"training {argv[0][:60]} ({arch.space}, key {arch.key()})") as display:
            evaluator.on_epoch = display  # type: ignore[attr-defined]  # "train" is a TrainEvaluator
            result = evaluator.evaluate(arch, seed=seed)
    except (ConfigError, EncodingError, InputError, MissingDependencyError) as err:  # what was given: usage, 2
        fail(str(err))
    except NasError as err:  # the architecture does not train (its forward fails, ...)
        print(printable(f"nas: error: {err}", lines=True), file=sys.stderr)  # it may quote the model
        raise SystemExit(1) from None
    record = {"key": arch.key(), "space": arch.space, **result.to_dict()}
    print(result_line(arch, result))
    if out is not None:
        try:
            atomic_write_json(out, record)
        except NasError as err:  # the result above stays on screen
            fail(str(err))
    if not result.ok:
        raise SystemExit(1)
