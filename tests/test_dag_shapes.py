"""Shape inference and argument checks: one test per validation rule.

Each case is a small base block whose error must name the node and say what
is wrong, in one line, so an LLM can act on it.
"""

from __future__ import annotations

import re

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nas.errors import EncodingError
from nas.spaces.nader.dag import parse_block_file
from nas.spaces.nader.dag.expr import ExprError, eval_int, evaluate, normal_form, parse_expr, to_python
from nas.spaces.nader.dag.ops import GLOSSARY, OPS
from nas.spaces.nader.dag.shapes import Position, analyse

POS = Position(C=64, dim=64, H=32, W=32)


def block(body: str, name: str = "T") -> str:
    """A base block: `body` holds nodes 2.. and edges; 0 is input, 1 output."""
    return f"##{name}##\n0:input\n1:output\n{body.strip()}\n"


def chain(*ops: str) -> str:
    """input -> ops[0] -> ops[1] ... -> output."""
    nodes = [f"{i + 2}:{op}" for i, op in enumerate(ops)]
    idx = ["0"] + [str(i + 2) for i in range(len(ops))] + ["1"]
    edges = [f"{a}->{b}" for a, b in zip(idx, idx[1:])]
    return block("\n".join(nodes + edges))


def check(text: str, pos: Position = POS, role: str = "base"):
    b = next(iter(parse_block_file(text, "t.txt").sections.values()))
    return analyse(b, pos, role)


def error(text: str, pos: Position = POS, role: str = "base") -> str:
    with pytest.raises(EncodingError) as info:
        check(text, pos, role)
    msg = str(info.value)
    assert "\n" not in msg
    assert msg.startswith("t.txt:")
    return msg


def test_glossary_is_complete():
    assert set(GLOSSARY) <= set(OPS)
    assert {"DropPath", "Concat"} <= set(OPS)  # used by the shared DARTS / ShuffleNet files


def test_valid_chain_keeps_shape_and_counts_cost():
    a = check(chain("Conv2d(out_channels=C,kernel_size=3)", "BN", "ReLU"))
    assert [d.expr for d in a.out_shape] == ["B", "C", "H", "W"]
    assert a.params == 64 * 64 * 9 + 64 + 2 * 64
    assert a.flops == 64 * 32 * 32 * 64 * 9 + 2 * 64 * 32 * 32


def test_unknown_op():
    assert "node 3: unknown op ROIAlign" in error(chain("BN", "ROIAlign(output_size=7)"))


def test_unknown_argument():
    msg = error(chain("Conv2d(out_channels=C,kernel_size=3,padd=1)"))
    assert "node 2: Conv2d got unknown argument 'padd'" in msg and "allowed:" in msg


def test_missing_argument():
    assert "node 2: Conv2d needs argument 'kernel_size'" in error(chain("Conv2d(out_channels=C)"))


def test_argument_twice():
    assert "argument 'out_channels' twice" in error(chain("Conv2d(C,3,out_channels=C)"))


def test_positional_arguments_follow_the_glossary_order():
    a = check(chain("Conv2d(C,3,1)"))
    assert a.out_shape[1].value == 64


def test_unknown_variable():
    assert "node 2: Conv2d: out_channels=K: unknown variable 'K'" in error(chain("Conv2d(out_channels=K,kernel_size=3)"))


def test_fractional_channels_are_rejected():
    msg = error(chain("Conv2d(out_channels=C/3,kernel_size=1)", "Conv2d(out_channels=C,kernel_size=1)"))
    assert "node 2" in msg and "'C/3' = 64/3 is not a whole number" in msg


def test_floor_mode_matches_nader():
    a = check(chain("Conv2d(out_channels=C/3,kernel_size=1)", "Conv2d(out_channels=C,kernel_size=1)"),
              Position(64, 64, 32, 32, exact=False))
    assert a.nodes["2"].shape[1].value == 21


def test_argument_below_minimum():
    assert "node 2: Conv2d: kernel_size=0 is 0, must be >= 1" in error(chain("Conv2d(out_channels=C,kernel_size=0)"))


def test_division_by_zero():
    assert "division by zero" in error(chain("Conv2d(out_channels=C/(C-C),kernel_size=1)"))


def test_single_input_op_with_two_inputs():
    msg = error(block("2:BN\n3:ReLU\n4:Conv2d(out_channels=C,kernel_size=1)\n0->2\n0->3\n2->4\n3->4\n4->1"))
    assert "node 4: Conv2d takes one input, has 2 (from nodes 2, 3)" in msg


def test_add_needs_two_inputs():
    assert "node 2: Add takes at least 2 inputs, has 1" in error(chain("Add"))


def test_multiply_takes_exactly_two():
    body = "2:reshape(B,C,H*W)\n3:permute(0,2,1)\n4:Multiply\n5:reshape(B,C,H,W)\n0->2\n2->3\n3->4\n2->4\n0->4\n4->5\n5->1"
    assert "node 4: Multiply takes exactly 2 inputs, has 3" in error(block(body))


def test_broadcast_failure_names_both_shapes():
    body = "2:Conv2d(out_channels=C,kernel_size=3,stride=2)\n3:Add\n0->2\n2->3\n0->3\n3->1"
    msg = error(block(body))
    assert "node 3: Add: shapes" in msg and "(B, C, (H+1)//2, (W+1)//2)" in msg and "do not broadcast" in msg


def test_broadcast_accepts_singleton_dims():
    body = "2:AdaptiveAvgPool2d(output_size=1)\n3:Mul\n0->2\n2->3\n0->3\n3->1"
    assert [d.value for d in check(block(body)).out_shape] == [2, 64, 32, 32]


def test_concat_other_dims_must_agree():
    body = "2:MaxPool2d(kernel_size=2,stride=2)\n3:concat(dim=1)\n4:Conv2d(out_channels=C,kernel_size=1)\n0->2\n0->3\n2->3\n3->4\n4->1"
    assert "node 3: concat(dim=1): inputs" in error(block(body))


def test_concat_dim_out_of_range():
    body = "2:BN\n3:concat(dim=4)\n0->2\n0->3\n2->3\n3->1"
    assert "node 3: concat: dim=4 is out of range for a 4-d input" in error(block(body))


def test_concat_adds_channels():
    body = "2:BN\n3:concat(dim=1)\n4:Conv2d(out_channels=C,kernel_size=1)\n0->2\n0->3\n2->3\n3->4\n4->1"
    a = check(block(body))
    assert a.nodes["3"].shape[1].value == 128 and a.nodes["3"].shape[1].expr == "C+C"


def test_matmul_inner_sizes():
    body = "2:reshape(B,C,H*W)\n3:BN\n4:Multiply\n5:reshape(B,C,H,W)\n0->2\n2->3\n2->4\n3->4\n4->5\n5->1"
    msg = error(block(body))
    assert "node 4: Multiply:" in msg and "inner sizes H*W = 1024 and C = 64 differ" in msg


def test_groups_must_divide_input_channels():
    msg = error(chain("Conv2d(out_channels=C,kernel_size=3,groups=3)"))
    assert "node 2: Conv2d: input channels C = 64 are not divisible by groups=3" in msg


def test_groups_must_divide_output_channels():
    msg = error(chain("Conv2d(out_channels=C-2,kernel_size=3,groups=4)", "Conv2d(out_channels=C,kernel_size=1)"))
    assert "node 2: Conv2d: out_channels=C-2 = 62 is not divisible by groups=4" in msg


def test_layer_norm_on_spatial_last_dimension():
    msg = error(chain("LN"))
    assert "node 2: LN normalises the last dimension, which is spatial (W)" in msg and "permute(0,2,3,1)" in msg


def test_layer_norm_channels_last_is_fine():
    check(chain("permute(0,2,3,1)", "LN", "permute(0,3,1,2)"))


def test_base_block_must_keep_the_shape():
    msg = error(chain("Conv2d(out_channels=C,kernel_size=3,stride=2)"))
    assert "node 1: output shape (B, C, (H+1)//2, (W+1)//2) = (2, 64, 16, 16) must keep the input size" in msg


def test_base_block_output_channels():
    msg = error(chain("Conv2d(out_channels=C*2,kernel_size=1)"))
    assert "node 1: output shape (B, C*2, H, W) = (2, 128, 32, 32) must be (B, dim, H, W) with dim = 64" in msg


def test_downsample_block_must_halve():
    text = chain("Conv2d(out_channels=dim,kernel_size=3)")
    msg = error(text, Position(64, 128, 32, 32), "downsample")
    assert "node 1: output shape (B, dim, H, W) = (2, 128, 32, 32) must halve the input size" in msg
    ok = check(chain("Conv2d(out_channels=dim,kernel_size=3,stride=2)"), Position(64, 128, 32, 32), "downsample")
    assert [d.value for d in ok.out_shape] == [2, 128, 16, 16]


def test_permute_must_be_a_permutation():
    assert "node 2: permute(0, 2, 2, 1) is not a permutation of the 4 dims" in error(chain("permute(0,2,2,1)"))


def test_reshape_element_count():
    msg = error(chain("reshape(B,C,H)", "reshape(B,C,H,W)"))
    assert "node 2: reshape(B, C, H) has 4096 elements but its input (B, C, H, W) has 131072" in msg


def test_reshape_single_minus_one():
    assert "node 2: reshape: at most one size may be -1" in error(chain("reshape(B,-1,-1,W)", "reshape(B,C,H,W)"))
    a = check(chain("reshape(B,-1,W)", "reshape(B,C,H,W)"))
    assert a.nodes["2"].shape[1].value == 64 * 32


def test_repeat_needs_enough_sizes():
    assert "node 2: repeat needs at least 4 sizes" in error(chain("repeat(1,2)"))


def test_variadic_ops_take_no_keywords():
    assert "node 2: permute takes positional values only" in error(chain("permute(dims=1)"))


def test_kernel_larger_than_input():
    msg = error(chain("Conv2d(out_channels=C,kernel_size=5,padding=0)"), Position(64, 64, 3, 3))
    assert "node 2: Conv2d: kernel_size=5 (dilation 1) is larger than the 3x3 input" in msg


def test_conv_needs_4d_input():
    msg = error(chain("reshape(B,C,H*W)", "Conv2d(out_channels=C,kernel_size=1)", "reshape(B,C,H,W)"))
    assert "node 3: Conv2d needs a 4-d input, got 3-d (B, C, H*W)" in msg


def test_drop_path_probability():
    assert "node 2: DropPath: drop_prob=1 must be below 1" in error(chain("DropPath(drop_prob=1)"))


def test_pool_needs_stride():
    assert "node 2: MaxPool2d needs argument 'stride'" in error(chain("MaxPool2d(kernel_size=3)"))


def test_error_says_where_in_the_network():
    msg = error(chain("Conv2d(out_channels=C,kernel_size=3,groups=3)"))
    assert msg.endswith("[at C=64, dim=64, H=32, W=32]")


# ------------------------------------------------------------ expressions


def test_expression_parser_rejects_garbage():
    for bad, why in [("C**2", "unexpected"), ("__import__", "unknown variable"), ("C+", "ends too early"),
                     ("(C", "ends too early"), ("(C+1 2)", "missing ')'"), ("C;", "unexpected character")]:
        with pytest.raises(ExprError, match=re.escape(why)):
            eval_int(bad, {"C": 4})


@pytest.mark.parametrize("text, python", [
    ("C/4/4", "C // 4 // 4"), ("dim-(C-1)", "dim - (C - 1)"), ("C*(H+1)", "C * (H + 1)"),
    # products and divisions bind alike: a right-hand one keeps its brackets, a left-hand one needs none
    ("C/(4*2)", "C // (4 * 2)"), ("C*4/2", "C * 4 // 2"), ("C*(4/2)", "C * (4 // 2)"), ("C/4*2", "C // 4 * 2"),
    ("C-(H-1)+W", "C - (H - 1) + W"), ("C+H*W", "C + H * W"), ("-(C*2)", "-(C * 2)"), ("C-H-W", "C - H - W"),
])
def test_to_python_uses_integer_division_and_brackets_only_where_needed(text, python):
    assert to_python(text) == python


EXPRS = st.recursive(
    st.one_of(st.sampled_from(["B", "C", "dim", "H", "W"]), st.integers(1, 9).map(str)),
    lambda inner: st.one_of(
        st.tuples(inner, st.sampled_from(["+", "-", "*"]), inner).map(lambda t: f"({t[0]}{t[1]}{t[2]})"),
        st.tuples(inner, st.integers(1, 9)).map(lambda t: f"{t[0]}/{t[1]}"),
        inner.map(lambda e: f"-{e}"),
    ),
    max_leaves=8,
)
ENVS = st.fixed_dictionaries({k: st.integers(1, 64) for k in ("B", "C", "dim", "H", "W")})


@settings(max_examples=200, deadline=None)
@given(EXPRS, ENVS)
def test_normal_form_keeps_the_value(text, env):
    assert evaluate(parse_expr(normal_form(text)), env) == evaluate(parse_expr(text), env)


@settings(max_examples=200, deadline=None)
@given(EXPRS)
def test_normal_form_is_spelling_invariant(text):
    """a*b vs b*a and a+b vs b+a normalise identically."""
    assert normal_form(f"({text})*C") == normal_form(f"C*({text})")
    assert normal_form(f"({text})+H") == normal_form(f"H+({text})")
