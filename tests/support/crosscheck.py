"""Cross-check our counts against NADER's `blocks-cifar/annos.json`.

annos.json gives, per block, the widths and depths NADER trained (4 stages,
depths 2-3-5-2, CIFAR-100 at 32x32) and its parameter and FLOP counts in
millions / billions rounded to 4 decimals.  Our parameter counts match to
the last digit once Conv2d has a bias.  Our FLOPs (fvcore, model in eval
mode) differ by a fixed, explainable amount: NADER counts normalisation
layers at 4 FLOPs per element (fvcore's training-mode count without affine
detection: BN +2 per element over eval's 2, LN -1 under eval's 5) and
average pooling at 1 per output element, which newer fvcore does not count.
`nader_flops` applies exactly that, and the result matches to rounding.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from nas.errors import EncodingError
from nas.spaces.nader.dag.macro import BlockSet, Plan, Skeleton, plan
from nas.spaces.nader.dag.ops import numel

PARAM_TOLERANCE = 50  # annos params are in M with 4 decimals: +-50 parameters
FLOP_TOLERANCE = 50_000  # flops in G with 4 decimals: +-50k


def element_counts(p: Plan) -> dict[str, int]:
    """Per-image output elements of each op type, summed over the network."""
    counts: dict[str, int] = {}
    for pl in p.placements:
        for info in pl.analysis.nodes.values():
            if info.spec is not None:
                name = info.spec.name
                counts[name] = counts.get(name, 0) + numel(info.shape) // pl.analysis.position.B * pl.count
    return counts


def nader_flops(p: Plan) -> int:
    """Our FLOPs re-counted with the conventions NADER's numbers follow (see module doc)."""
    n = element_counts(p)
    return p.flops + 2 * n.get("BN", 0) - n.get("LN", 0) + n.get("AvgPool2d", 0)


@dataclass
class CrossCheck:
    block: str
    widths: list[int]
    depths: list[int]
    annos_params: int
    annos_flops: int
    params: int | None = None
    flops: int | None = None
    nader_flops: int | None = None
    exact: bool = True
    params_match: bool = False
    flops_match: bool = False
    note: str = ""


def crosscheck(nader_dir: Path, num_classes: int = 100, input_size: int = 32) -> list[CrossCheck]:
    annos = json.loads((nader_dir / "annos.json").read_text())
    rows = []
    for name, entry in annos.items():
        row = CrossCheck(name, entry["widths"], entry["depths"],
                         round(entry["params"] * 1e6), round(entry["flops"] * 1e9))
        rows.append(row)
        path = nader_dir / f"{name}.txt"
        if not path.exists():
            row.note = "no block file shared for this entry"
            continue
        blocks = BlockSet.from_text(path.read_text(), str(path))
        widths = entry["widths"]
        if any(w != widths[0] * 2**i for i, w in enumerate(widths)):
            row.note = "widths are not w, 2w, 4w, 8w"
            continue
        for exact in (True, False):
            sk = Skeleton(depths=tuple(entry["depths"]), input_size=input_size, num_classes=num_classes, exact=exact)
            try:
                p = plan(blocks, sk, widths[0])
            except EncodingError as exc:
                row.note = str(exc)
                continue
            row.exact, row.note = exact, "" if exact else "needs floored channel arithmetic (NADER's int())"
            row.params, row.flops, row.nader_flops = p.params, p.flops, nader_flops(p)
            break
        if row.params is None:
            continue
        row.params_match = abs(row.params - row.annos_params) <= PARAM_TOLERANCE
        row.flops_match = abs(row.nader_flops - row.annos_flops) <= FLOP_TOLERANCE
        if not row.params_match:
            ratio = row.annos_params / row.params
            row.note = (f"params differ {ratio:.1f}x: the shared file is not the block these numbers were "
                        "measured on") if ratio > 2 or ratio < 0.5 else "params differ"
    return rows


def as_dicts(rows: list[CrossCheck]) -> list[dict]:
    return [asdict(r) for r in rows]
