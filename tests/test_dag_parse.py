"""NADER block-DAG language: parsing, round trip and structural validation."""

from __future__ import annotations

from pathlib import Path

import pytest

from nas.errors import EncodingError
from nas.spaces.nader.dag import OPS, Block, Node, parse_block_file, validate_structure

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "nader"
SUBDIRS = ("blocks", "blocks-cifar", "darts")


def _data_files() -> list[Path]:
    return [f for d in SUBDIRS for f in sorted((DATA / d).glob("*.txt"))]


@pytest.fixture(scope="module")
def data_files() -> list[Path]:
    files = _data_files()
    if not files:
        pytest.skip(f"NADER data not found under {DATA}")
    return files


RESNET = """\
##ResNetBasicBlock##
0:input
1:output
2:Conv2d(out_channels=C,kernel_size=3,stride=1)
3:BN
4:ReLU
5:Add
0->2
2->3
3->4
4->5
0->5
5->1
"""


def _err(text: str) -> str:
    bf = parse_block_file(text, "block.txt")
    with pytest.raises(EncodingError) as info:
        for block in bf.sections.values():
            validate_structure(block)
    return str(info.value)


def _parse_err(text: str) -> str:
    with pytest.raises(EncodingError) as info:
        parse_block_file(text, "block.txt")
    return str(info.value)


# --------------------------------------------------------------- real data


def test_all_data_files_parse_and_validate(data_files):
    n_sections = 0
    for path in data_files:
        bf = parse_block_file(path.read_text(), path.name)
        assert bf.sections, path
        for block in bf.sections.values():
            validate_structure(block)
            n_sections += 1
    assert n_sections >= 3 * len(data_files)


def test_data_ops_all_in_glossary(data_files):
    used = set()
    for path in data_files:
        for block in parse_block_file(path.read_text(), path.name).sections.values():
            used |= {n.op for n in block.nodes.values() if not n.is_io}
    assert used <= OPS
    assert {"Conv2d", "BN", "ReLU", "Add", "concat", "Concat", "DropPath", "permute", "reshape"} <= used


def test_data_round_trip(data_files):
    for path in data_files:
        bf = parse_block_file(path.read_text(), path.name)
        again = parse_block_file(bf.to_text(), "rt")
        assert again == bf, path
        for name, block in bf.sections.items():
            assert parse_block_file(block.to_text()).sections[name] == block


def test_data_header_and_input_spellings(data_files):
    names = set()
    two_input = 0
    for path in data_files:
        for name, block in parse_block_file(path.read_text(), path.name).sections.items():
            names.add(name)
            ops = {n.op for n in block.nodes.values()}
            two_input += {"input1", "input2"} <= ops
    assert "ResNetBasicBlock_stem" in names and "ResNetBasicBlock_downsample" in names
    assert two_input >= 4  # DARTS base/downsample cells


def test_single_line_deletion_never_crashes(data_files):
    for path in data_files:
        lines = path.read_text().splitlines()
        for i in range(len(lines)):
            text = "\n".join(lines[:i] + lines[i + 1 :])
            try:
                for block in parse_block_file(text, path.name).sections.values():
                    validate_structure(block)
            except EncodingError as e:
                assert str(e) and "\n" not in str(e)


# --------------------------------------------------------------- parsing


def test_parse_basic_structure():
    bf = parse_block_file("\n  \n" + RESNET.replace("3:BN", "  3 : BN  ") + "\n\n", "x.txt")
    block = bf.sections["ResNetBasicBlock"]
    assert block.line == 3
    assert block.nodes["2"] == Node("2", "Conv2d", {"out_channels": "C", "kernel_size": "3", "stride": "1"}, 0)
    assert block.nodes["3"].op == "BN" and block.nodes["3"].line == 7
    assert block.edges[0] == ("0", "2")
    validate_structure(block)


def test_positional_args_and_expressions_kept_as_text():
    bf = parse_block_file(
        "##S##\n0:input\n1:output\n2:reshape(B, C/4/4, 4, H, W)\n3:permute(0,2,1,3,4)\n"
        "4:Conv2d(out_channels=dim - C,groups=dim//2)\n0->2\n2->3\n3->4\n4->1\n"
    )
    nodes = bf.sections["S"].nodes
    assert nodes["2"].args == {"0": "B", "1": "C/4/4", "2": "4", "3": "H", "4": "W"}
    assert nodes["4"].args == {"out_channels": "dim-C", "groups": "dim//2"}
    assert nodes["2"].to_text() == "2:reshape(B,C/4/4,4,H,W)"
    assert parse_block_file(bf.to_text()) == bf


def test_an_empty_argument_list_is_no_arguments():
    plain = parse_block_file(RESNET).sections["ResNetBasicBlock"]
    for empty in ("3:BN()", "3:BN( )"):
        block = parse_block_file(RESNET.replace("3:BN", empty)).sections["ResNetBasicBlock"]
        assert block.nodes["3"] == plain.nodes["3"] and block.nodes["3"].args == {}


def test_round_trip_block_to_text():
    block = parse_block_file(RESNET).sections["ResNetBasicBlock"]
    assert block.to_text() == RESNET
    assert isinstance(block, Block)


def test_unbalanced_parentheses():
    text = RESNET.replace("3:BN", "3:Conv2d(in=C")
    assert _parse_err(text) == "block.txt:5: node line '3:Conv2d(in=C' has unbalanced parentheses"


@pytest.mark.parametrize(
    "bad, fragment",
    [
        ("3:Conv2d(a=C)x", "has text after its argument list"),
        ("3:Conv2d(a=C,a=1)", "repeats argument 'a'"),
        ("3:Conv2d(a=C,1)", "positional argument '1' follows a keyword argument"),
        ("3:Conv2d(a=C+)", "argument a='C+' is not an expression"),
        ("3:Conv2d(a=eval('x'))", "is not an expression"),
        ("3:Conv2d(a=C,,b=1)", "has an empty argument"),
        ("3:Conv2d(,)", "has an empty argument"),
        ("3:Conv2d( , )", "has an empty argument"),
        ("3 BN", "is neither a ##name## header"),
        ("3->", "edge line '3->' is not of the form a->b"),
    ],
)
def test_syntax_errors_name_line(bad, fragment):
    msg = _parse_err(RESNET.replace("3:BN", bad))
    assert msg.startswith("block.txt:5: ") and fragment in msg, msg


def test_bad_header_and_orphan_lines():
    assert _parse_err("##Broken#\n0:input\n").startswith("block.txt:1: header line '##Broken#'")
    assert "comes before any ##name## header" in _parse_err("\n0:input\n##A##\n")
    assert _parse_err("\n0:input\n##A##\n").startswith("block.txt:2:")
    assert "section 'ResNetBasicBlock' is defined twice (first at line 1)" in _parse_err(RESNET + RESNET)
    assert _parse_err("   \n") == "block.txt: no ##name## section found"


def test_duplicate_node_index():
    msg = _parse_err(RESNET.replace("4:ReLU", "4:ReLU\n3:GELU"))
    assert msg == "block.txt:7: node 3 is defined twice in 'ResNetBasicBlock' (first at line 5)"


# --------------------------------------------------------------- validation


def test_edge_to_undefined_node():
    msg = _err(RESNET.replace("4->5\n", "4->5\n4->9\n"))
    assert msg == "block.txt:12: block 'ResNetBasicBlock': edge 4->9: node 9 is not defined"
    msg = _err(RESNET.replace("0->2\n", "7->2\n0->2\n"))
    assert "edge 7->2: node 7 is not defined" in msg


def test_cycle_names_node():
    msg = _err(RESNET.replace("4->5\n", "4->5\n4->2\n"))
    assert "node 2: on a cycle 2->3->4->2" in msg
    assert msg.startswith("block.txt:4: ")


def test_input_count():
    assert "needs exactly one input node (found none)" in _err(RESNET.replace("0:input", "0:ReLU"))
    assert "needs exactly one input node (found 0, 6)" in _err(RESNET.replace("5:Add", "5:Add\n6:input"))
    msg = _err(RESNET.replace("0:input", "0:input1"))
    assert "needs exactly one input2 node (found none)" in msg
    assert "mixes 'input' with 'input1'/'input2'" in _err(RESNET.replace("5:Add", "5:Add\n6:input1"))


def test_output_count():
    assert "needs exactly one output node (found none)" in _err(RESNET.replace("1:output", "1:ReLU"))
    assert "needs exactly one output node (found 1, 6)" in _err(RESNET.replace("5:Add", "5:Add\n6:output"))


def test_two_input_cell_ok():
    text = "##Cell##\n0:input1\n1:input2\n2:output\n3:Add\n0->3\n1->3\n3->2\n"
    validate_structure(parse_block_file(text).sections["Cell"])


def test_unreachable_from_input():
    msg = _err(RESNET.replace("5:Add", "5:Add\n6:ReLU").replace("0->5", "0->5\n6->5"))
    assert msg == "block.txt:8: block 'ResNetBasicBlock': node 6: unreachable from input"


def test_not_reaching_output():
    msg = _err(RESNET.replace("5:Add", "5:Add\n6:ReLU").replace("0->5", "0->5\n4->6"))
    assert msg == "block.txt:8: block 'ResNetBasicBlock': node 6: does not reach output"


def test_unknown_op():
    msg = _err(RESNET.replace("3:BN", "3:ROIAlign(output_size=H)"))
    assert msg == "block.txt:5: block 'ResNetBasicBlock': node 3: unknown op ROIAlign"


def test_output_without_incoming_edge():
    msg = _err(RESNET.replace("5->1\n", ""))
    assert msg == "block.txt:3: block 'ResNetBasicBlock': node 1: output has no incoming edge"


def test_output_edge_direction_and_fan_in():
    assert "node 1: output has an outgoing edge to node 3" in _err(RESNET + "1->3\n")
    assert "node 1: output must have exactly one incoming edge (has 5, 4)" in _err(RESNET + "4->1\n")
    assert "node 0: input has an incoming edge from node 4" in _err(RESNET + "4->0\n")
    assert "edge 2->3 is listed twice" in _err(RESNET + "2->3\n")
    assert "node 0: input takes no arguments" in _err(RESNET.replace("0:input", "0:input(x=1)"))


def test_without_repeated_edges_keeps_each_edge_once_at_its_first_line():
    from nas.spaces.nader.dag.validate import without_repeated_edges

    text = "##B##\n0:input\n1:output\n2:ReLU\n3:Add\n0->2\n2->3\n0->3\n2->3\n3->1\n0->3\n"
    block = parse_block_file(text, "b.txt").sections["B"]
    once, repeated = without_repeated_edges(block)
    assert repeated == ["2->3", "0->3"]
    assert once.edges == [("0", "2"), ("2", "3"), ("0", "3"), ("3", "1")]
    assert [once.edge_line(i) for i in range(4)] == [6, 7, 8, 10]
    validate_structure(once)
    with pytest.raises(EncodingError, match="edge 2->3 is listed twice"):
        validate_structure(block)                      # the language itself stays strict
    assert without_repeated_edges(once) == (once, [])


def test_without_dead_nodes_drops_what_reaches_no_output_and_keeps_indices_and_lines():
    from nas.spaces.nader.dag.validate import without_dead_nodes

    text = "##B##\n0:input\n1:output\n2:ReLU\n3:GELU\n4:Sigmoid\n0->2\n2->3\n3->4\n2->1\n"
    block = parse_block_file(text, "b.txt").sections["B"]
    live, dead = without_dead_nodes(block)
    assert dead == ["3", "4"] and list(live.nodes) == ["0", "1", "2"]
    assert live.edges == [("0", "2"), ("2", "1")] and [live.edge_line(i) for i in range(2)] == [7, 10]
    validate_structure(live)
    with pytest.raises(EncodingError, match="node 3: does not reach output"):
        validate_structure(block)                      # the language itself stays strict
    two_outputs = parse_block_file(text.replace("4:Sigmoid", "4:output"), "b.txt").sections["B"]
    assert without_dead_nodes(two_outputs) == (two_outputs, [])
