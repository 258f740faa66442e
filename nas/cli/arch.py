"""`nas arch validate FILE... | show FILE | draw FILE`: architecture files, two representations.

A ``.py`` file is a FairNAD-style model source (``Network(num_classes=...)``),
checked only inside the sandbox; anything else is a NADER block file.
"""

from __future__ import annotations

import argparse
import json
import sys
import textwrap
from pathlib import Path
from typing import Any

from nas.core.arch import stable_hash
from nas.core.constraint import Constraint
from nas.core.trial import SELF_REPORTED
from nas.errors import EncodingError, NasError
from nas.io import read_input_text
from nas.lazy import LazyImport
from nas.sandbox import verify_model_source
from nas.spaces.nader.arch import BlockArch
from nas.spaces.nader.dag.draw import draw_blocks
from nas.spaces.nader.dag.macro import NOMINAL_WIDTHS, BlockSet, Skeleton, plan, search_width, section_errors
from nas.spaces.nader.dag.parse import parse_block_file
from nas.terminal import printable

# torch: only `arch show` of a block file builds the network (validate, draw and `--help` stay torch-free)
measure = LazyImport("nas.measure")
network = LazyImport("nas.spaces.nader.network")

SKELETONS = ("nb201", "imagenet")
DESCRIPTIONS = {
    "validate": "Check block files (structure, arguments, shapes at every position, budget) or "
                "model .py files, each in its own sandbox, one after another. Exit 0 if all are valid, "
                "1 if any is not; errors on stdout.",
    "show": "Key, width, params, FLOPs and PyTorch source of an architecture file: a '#' summary line, "
            "then the self-contained source (a runnable model file); --json for every field.",
    "draw": "Draw a valid block file's graphs as a PNG (an invalid file: validate's errors, exit 1, no PNG).",
}


def _parser(command: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"nas arch {command}", description=DESCRIPTIONS[command])
    if command == "validate":
        p.add_argument("files", type=Path, nargs="+", metavar="FILE")
    else:
        p.add_argument("file", type=Path)
    if command == "draw":
        p.add_argument("-o", "--out", type=Path, required=True, help="PNG to write")
    p.add_argument("--skeleton", choices=SKELETONS, default="nb201",
                   help="nb201: 3 stages of N blocks (default); imagenet: NADER's 4 stages 2-3-5-2")
    p.add_argument("--depth", type=int, default=5, help="blocks per stage for nb201 (default 5)")
    p.add_argument("--input-size", type=int, default=32, help="image size (default 32; 16 = ImageNet16-120)")
    p.add_argument("--num-classes", type=int, default=10)
    p.add_argument("--width", type=int, default=None, help="fixed width w instead of the widest that fits")
    p.add_argument("--max-params", type=float, default=None, help="budget in parameters (default 1.5e6)")
    p.add_argument("--max-flops", type=float, default=None,
                   help="budget in FLOPs per image (default 0.2e9 at 32x32, 0.05e9 at 16x16)")
    if command == "show":
        p.add_argument("--json", action="store_true", help="print JSON (default: a summary line and the source)")
    elif command == "validate":
        p.add_argument("--parent", type=Path, default=None, help="parent model .py for the structural check")
    return p


def _skeleton(args: argparse.Namespace):
    if args.skeleton == "imagenet":
        return Skeleton.imagenet_style(input_size=args.input_size, num_classes=args.num_classes)
    return Skeleton.nb201(n=args.depth, input_size=args.input_size, num_classes=args.num_classes)


def _budget(args: argparse.Namespace):
    for flag, value in (("--max-params", args.max_params), ("--max-flops", args.max_flops)):
        if value is not None and value < 0:
            raise NasError(f"{flag} must be a positive number, got {value:g}")
    # 0 or unset: NB201's limit at the input size
    return Constraint(params=args.max_params or None, flops=args.max_flops or None).filled(
        Constraint.nb201(args.input_size))


def _read(path: Path) -> str:
    return read_input_text(path)


def block_errors(text: str, source: str, args: argparse.Namespace) -> list[str]:
    """Every problem of a block file, one line each (first per section, then the budget)."""
    try:
        blocks = BlockSet.from_text(text, source)
    except EncodingError as exc:
        return [str(exc)]
    skeleton = _skeleton(args)
    errors = section_errors(blocks, skeleton, (args.width,) if args.width else NOMINAL_WIDTHS)
    if errors:
        return errors
    try:
        if args.width:
            plan(blocks, skeleton, args.width)
        else:
            search_width(blocks, skeleton, _budget(args))
    except EncodingError as exc:
        message = str(exc)
        return [message if message.startswith(source) else f"{source}: {message}"]
    return []


def _validate(args: argparse.Namespace) -> int:
    """Every file is read first (a missing one stops before any check), then checked in turn:
    one line per model file, so a file whose check fails does not hide the others'."""
    texts = {path: _read(path) for path in dict.fromkeys(args.files)}
    parent = _read(args.parent) if args.parent else None
    return max(_validate_one(path, text, parent, args) for path, text in texts.items())


def _validate_one(path: Path, text: str, parent: str | None, args: argparse.Namespace) -> int:
    if path.suffix == ".py":
        verdict = _verify(args, path, text, parent)
        if verdict.ok:
            how = (f"; {SELF_REPORTED}: the model could not be exported as a graph ({verdict.export_error})"
                   if verdict.self_reported else "")
            line, status = f"{path}: valid model ({verdict.params:,} params, {verdict.flops:,} FLOPs{how})", 0
        else:
            line, status = f"{path}: {verdict.error}", 1
        print(printable(line), flush=True)  # one line, whatever the file's name or the model's messages hold
        return status
    errors = block_errors(text, str(path), args)
    for line in errors:
        print(printable(line))  # a block file's names (an LLM wrote it) quoted in its errors
    if not errors:
        print(printable(f"{path}: valid"))
    sys.stdout.flush()
    return 1 if errors else 0


def _verify(args: argparse.Namespace, path: Path, text: str, parent: str | None):
    size = args.input_size
    return verify_model_source(text, num_classes=args.num_classes, input_shape=(2, 3, size, size),
                               parent_source=parent, filename=path.name)


def show_block(text: str, source: str, args: argparse.Namespace) -> dict[str, Any]:
    arch = BlockArch.from_text(text, source)
    skeleton = _skeleton(args)
    budget = _budget(args)
    width = args.width or search_width(arch.blocks, skeleton, budget).width
    p = arch.plan(skeleton, width=width)
    net = network.build_network(p)
    size = skeleton.input_size
    return {
        "file": source,
        "kind": "blocks",
        "key": arch.key(),
        "section_keys": arch.section_keys(),
        "sections": {role: b.name for role, b in arch.blocks.sections().items()},
        "skeleton": {"depths": list(skeleton.depths), "input_size": size, "num_classes": skeleton.num_classes},
        "budget": {"params": budget.params, "flops": budget.flops},
        "width": width,
        "widths": p.widths,
        "params": measure.count_params(net),
        "flops": measure.count_flops(net, (1, skeleton.in_channels, size, size)),
        "source": network.network_source(p),
    }


def show_model(text: str, args: argparse.Namespace) -> dict[str, Any]:
    verdict = _verify(args, args.file, text, None)
    if not verdict.ok:
        raise NasError(f"{args.file}: {verdict.error}")
    return {
        "file": str(args.file),
        "kind": "model",
        "key": stable_hash("model", text),
        "width": None,
        "params": verdict.params,
        "flops": verdict.flops,
        "source": text,
    }


def _show(args: argparse.Namespace) -> int:
    text = _read(args.file)
    info = show_model(text, args) if args.file.suffix == ".py" else show_block(text, str(args.file), args)
    if args.json:
        print(json.dumps(info, indent=2))
    else:  # the summary as a comment, so `nas arch show F > net.py` is a runnable model file
        width = f" width {info['width']} (widths {info['widths']})" if info["width"] else ""
        print(printable(f"# {info['file']}: key {info['key']}{width}, {info['params']:,} params, "
                        f"{info['flops'] / 1e6:.1f} MFLOPs"))
        # Escaped: a control character in the file would reach the terminal (inside a literal, its `\xNN` spelling
        # means the same to Python, so the printed file still runs)
        source = printable(info["source"], lines=True)
        print(source, end="" if source.endswith("\n") else "\n")
    return 0


def _draw(args: argparse.Namespace) -> int:
    if args.file.suffix == ".py":
        raise NasError(f"{args.file}: drawing needs a block file, not model source")
    text = _read(args.file)
    errors = block_errors(text, str(args.file), args)  # a picture of an invalid file would mislead
    for line in errors:
        print(printable(line))
    if errors:
        return 1

    out = draw_blocks(parse_block_file(text, str(args.file)).sections, args.out, title=args.file.name)
    print(f"wrote {out}")
    return 0


def main(argv: list[str]) -> None:
    commands = {"validate": _validate, "show": _show, "draw": _draw}
    if argv and argv[0] in ("-h", "--help"):
        print("usage: nas arch validate FILE... | {show,draw} FILE [options]   "
              "(nas arch COMMAND --help for options)\n")
        for name, text in DESCRIPTIONS.items():
            print(textwrap.fill(text, 100, initial_indent=f"  {name:9s} ", subsequent_indent=" " * 12))
        raise SystemExit(0)
    if not argv or argv[0] not in commands:
        got = f" '{argv[0]}'" if argv else ""
        print(f"nas: error: unknown arch command{got} (valid: {', '.join(commands)})", file=sys.stderr)
        raise SystemExit(2)
    args = _parser(argv[0]).parse_args(argv[1:])
    try:
        code = commands[argv[0]](args)
    except NasError as err:
        print(printable(f"nas: error: {err}", lines=True), file=sys.stderr)
        raise SystemExit(2) from None
    except BrokenPipeError:  # `nas arch show ... | head`
        sys.stderr.close()
        code = 0
    raise SystemExit(code)
