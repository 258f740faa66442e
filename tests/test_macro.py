"""Macro skeleton, budgets and width search; the annos.json cross-check."""

from __future__ import annotations

from pathlib import Path

import pytest

from nas.core.constraint import Constraint
from nas.errors import ConfigError, EncodingError
from nas.spaces.nader.dag.macro import BlockSet, Skeleton, plan, role_of, search_width, section_errors
from support.crosscheck import crosscheck

HERE = Path(__file__).resolve().parent
BLOCKS = HERE / "data" / "blocks"
NADER = HERE.parents[1] / "shared" / "data" / "nader"


def blockset(name: str) -> BlockSet:
    return BlockSet.from_text((BLOCKS / name).read_text(), name)


def test_roles_from_section_names():
    assert role_of("ResNetBasicBlock") == "base"
    assert role_of("DARTSv2_base") == "base"
    assert role_of("X_stem") == role_of("stem_block") == "stem"
    assert role_of("X_downsample") == role_of("downsample_block") == "downsample"


def test_missing_role_comes_from_the_parent_or_is_an_error():
    parent = blockset("residual.txt")
    base_only = "##New##\n0:input\n1:output\n2:BN\n0->2\n2->1\n"
    child = BlockSet.from_text(base_only, "child.txt", fallback=parent)
    assert child.base.name == "New" and child.stem is parent.stem
    with pytest.raises(EncodingError, match=r"child.txt: no stem section \(found New"):
        BlockSet.from_text(base_only, "child.txt")


def test_second_section_of_a_role_is_an_error():
    text = (BLOCKS / "residual.txt").read_text() + "##Other_stem##\n0:input\n1:output\n0->1\n"
    with pytest.raises(EncodingError, match="second stem section 'Other_stem'"):
        BlockSet.from_text(text, "f.txt")


def test_nb201_skeleton_layout():
    p = plan(blockset("residual.txt"), Skeleton.nb201(), 16)
    assert p.widths == [16, 32, 64]
    roles = [(pl.role, pl.count, pl.analysis.position.C, pl.analysis.position.H) for pl in p.placements]
    assert roles == [("stem", 1, 3, 32), ("base", 5, 16, 32), ("downsample", 1, 16, 32), ("base", 5, 32, 16),
                     ("downsample", 1, 32, 16), ("base", 5, 64, 8)]
    assert p.final_hw == 8


def test_imagenet_style_skeleton_has_four_stages():
    p = plan(blockset("residual.txt"), Skeleton.imagenet_style(), 8)
    assert p.widths == [8, 16, 32, 64]
    assert [pl.count for pl in p.placements if pl.role == "base"] == [2, 3, 5, 2]


def test_width_search_is_the_largest_fitting_width():
    blocks, sk = blockset("residual.txt"), Skeleton.nb201()
    budget = Constraint.nb201(32)
    choice = search_width(blocks, sk, budget, multiple=1)
    assert budget.fits(choice.params, choice.flops)
    above = plan(blocks, sk, choice.width + 1)
    assert not budget.fits(above.params, above.flops)
    assert choice.probes < 40  # a binary search, not a scan


def test_width_search_rounds_down_to_a_multiple_within_the_budget():
    blocks, sk = blockset("residual.txt"), Skeleton.nb201()
    exact = search_width(blocks, sk, multiple=1)
    assert exact.width == 25  # NB201's budget: 1.5 M params, 0.2 GFLOPs
    rounded = search_width(blocks, sk)  # default: multiples of 8, for tensor cores
    assert rounded.width == 24 and Constraint.nb201(32).fits(rounded.params, rounded.flops)
    assert (rounded.params, rounded.flops) == (plan(blocks, sk, 24).params, plan(blocks, sk, 24).flops)
    assert search_width(blocks, sk, multiple=5).width == 25  # already a multiple
    assert search_width(blocks, sk, multiple=16).width == 16
    # a budget below one multiple keeps the exact width rather than failing
    small = Constraint(params=2e4, flops=1e9)
    tiny = search_width(blocks, sk, small, multiple=8)
    assert 0 < tiny.width < 8 and tiny.width == search_width(blocks, sk, small, multiple=1).width
    with pytest.raises(ConfigError, match=r"width multiple must be an integer >= 1, got 0"):
        search_width(blocks, sk, multiple=0)


def test_width_multiple_skips_invalid_multiples():
    """shuffle_se is valid only at multiples of 8 (96 fits the budget): with multiples of 10,
    90 is skipped as invalid and 80 chosen."""
    blocks, sk = blockset("shuffle_se.txt"), Skeleton.nb201()
    assert [search_width(blocks, sk, multiple=m).width for m in (1, 8, 10, 12, 36)] == [96, 96, 80, 96, 72]
    with pytest.raises(EncodingError):
        plan(blocks, sk, 90)


def test_width_search_skips_invalid_widths():
    """C/2 with groups=2 and C/4 reshapes: only some widths are valid."""
    blocks, sk = blockset("shuffle_se.txt"), Skeleton.nb201()
    choice = search_width(blocks, sk)
    assert choice.width % 8 == 0
    for w in range(choice.width + 1, choice.width + 8):
        with pytest.raises(EncodingError):
            plan(blocks, sk, w)


def test_default_budgets():
    assert Constraint.nb201(32) == Constraint(params=1.5e6, flops=0.2e9)
    assert Constraint.nb201(16) == Constraint(params=1.5e6, flops=0.05e9)
    small = search_width(blockset("residual.txt"), Skeleton.nb201(input_size=16, num_classes=120))
    assert small.flops <= 0.05e9


def test_tighter_budget_gives_narrower_network():
    blocks, sk = blockset("residual.txt"), Skeleton.nb201()
    wide = search_width(blocks, sk, Constraint(params=1.5e6, flops=0.2e9))
    narrow = search_width(blocks, sk, Constraint(params=0.3e6, flops=0.2e9))
    assert narrow.width < wide.width and narrow.params <= 0.3e6


def test_depth_options_pick_the_one_using_most_budget():
    choice = search_width(blockset("residual.txt"), Skeleton.nb201(), depth_options=((1, 1, 1), (3, 3, 3), (5, 5, 5)))
    assert choice.depths in {(1, 1, 1), (3, 3, 3), (5, 5, 5)}
    singles = [search_width(blockset("residual.txt"), Skeleton(depths=d)) for d in ((1, 1, 1), (3, 3, 3), (5, 5, 5))]
    assert choice.params == max(s.params for s in singles)


def test_nothing_fits_says_how_far_off():
    with pytest.raises(EncodingError, match=r"no width fits the budget \(0.001 M params"):
        search_width(blockset("residual.txt"), Skeleton.nb201(), Constraint(params=1e3, flops=1e9))


def test_block_broken_at_every_width_reports_a_readable_position():
    text = (BLOCKS / "residual.txt").read_text().replace("5:Conv2d(out_channels=C,kernel_size=3,stride=1)",
                                                         "5:Conv2d(out_channels=C,kernel_size=3,stride=2)")
    with pytest.raises(EncodingError, match=r"node 7: Add: .* \[at C=64, dim=64, H=32, W=32\]"):
        search_width(BlockSet.from_text(text, "r.txt"), Skeleton.nb201())


def test_two_input_cells_get_projected_inputs():
    p = plan(blockset("two_input_cell.txt"), Skeleton.nb201(), 16)
    # stem output (16 ch) equals the first cells' width: no projection until a downsample changes shapes
    assert [(q.cin, q.cout, q.stride) for q in p.preprocess][:3] == [(16, 32, 1), (16, 32, 1), (16, 32, 2)]


@pytest.fixture(scope="module")
def annos_rows():
    if not (NADER / "blocks-cifar" / "annos.json").exists():
        pytest.skip(f"NADER annos.json not found under {NADER}")
    return {r.block: r for r in crosscheck(NADER / "blocks-cifar")}


def test_annos_params_and_flops_match_to_rounding(annos_rows):
    matched = [r.block for r in annos_rows.values() if r.params_match and r.flops_match]
    assert matched == [f"block_{i}" for i in range(1, 9)]
    assert not annos_rows["block_7"].exact  # C/4 at C=247: NADER floors


def test_annos_mismatches_are_explained(annos_rows):
    for name in ("block_9", "block_10"):
        assert "not the block these numbers were measured on" in annos_rows[name].note
    missing = [r for r in annos_rows.values() if r.params is None]
    assert missing and all(r.note == "no block file shared for this entry" for r in missing)


def test_section_errors_only_for_sections_broken_at_every_width():
    """groups=32 on C/4 fails at w=64 but not at w=128: not an error of the block."""
    text = (BLOCKS / "residual.txt").read_text().replace(
        "5:Conv2d(out_channels=C,kernel_size=3,stride=1)", "5:Conv2d(out_channels=C,kernel_size=3,groups=128)")
    blocks = BlockSet.from_text(text, "r.txt")
    assert section_errors(blocks, Skeleton.nb201()) == []
    broken = BlockSet.from_text(text.replace("groups=128", "groups=7"), "r.txt")
    [only] = section_errors(broken, Skeleton.nb201())
    assert "block 'Residual': node 5: Conv2d: input channels C = 64 are not divisible by groups=7" in only
