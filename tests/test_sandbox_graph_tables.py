"""Case tables of the graph loader (nas/sandbox/graph.py) and of the work folder's disk count
(nas/sandbox/verify.py), called in this process: the exact message for each way an artifact's ZIP
layout differs from what `pack` writes, the bits each literal spells, the order `carried` names
what a network carries, and the bytes a folder holds."""

from __future__ import annotations

import io
import os
import re
import struct
import warnings
import zipfile
from pathlib import Path

import pytest
import torch
from torch import nn

from nas.sandbox import graph as loader
from nas.sandbox.graph import GraphError, GraphNet, export_graph, float_bits, int_bits, pack, tensor_bits, unpack
from test_graph_bounds import X, net, node

_END, _Ref, _Spelling, _entries, _header, _json = (loader._END, loader._Ref, loader._Spelling, loader._entries,
                                                   loader._header, loader._json)

LONG = "n" * 100  # a name longer than the 60 characters a message quotes


def _zip(*names: str, method: int = zipfile.ZIP_STORED, extra: bytes = b"", body: bytes = b"{}") -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", method) as archive, warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a duplicate name
        for name in names:
            info = zipfile.ZipInfo(name, (2026, 1, 1, 0, 0, 0))
            info.compress_type, info.extra = method, extra
            archive.writestr(info, body)
    return buffer.getvalue()


def _counted(data: bytes, count: int) -> bytes:
    """`data` with its end record saying `count` entries (on this disk and in all)."""
    fields = list(_END.unpack_from(data, len(data) - _END.size))
    fields[3] = fields[4] = count
    return data[:-_END.size] + _END.pack(*fields)


DIRECTORY_ENTRY = 46  # a central directory entry's fixed part


def _offset_at_directory(data: bytes) -> bytes:
    """`data` (one entry) with its directory entry's local header offset pointing at the directory itself."""
    start = _END.unpack_from(data, len(data) - _END.size)[6]
    return data[:start + 42] + struct.pack("<L", start) + data[start + 46:]


@pytest.mark.parametrize("data, expected, max_bytes, message", [
    (b"PK\x05\x06" + bytes(17), {"a"}, 100, r"artifact is malformed \(shorter than a ZIP end record\)"),
    (_zip("a", "b"), {"a"}, 100, r"artifact's ZIP directory lists 2 entries, over the 1 expected"),
    (_zip("a") + b"x", {"a"}, 100, r"artifact is malformed \(no ZIP end record at its end, a comment, or several"),
    (_zip(LONG, extra=b"\xfe\xca\x00\x00"), {LONG}, 100,
     rf"artifact's ZIP directory entry 0 \('{'n' * 60}'\) is malformed"),
    (_zip(LONG, method=zipfile.ZIP_DEFLATED, body=b"{}" * 50), {LONG}, 1000, rf"artifact's entry '{'n' * 60}' is compressed"),
    (_zip(LONG), {"a"}, 100, rf"artifact has unexpected files \('{'n' * 60}'; expected a\)"),
    (_zip("b", "a"), {"a", "c"}, 100, r"artifact has unexpected files \('b'; expected a, c\)"),
    (_zip("a", "a"), {"a", "b"}, 100, r"artifact's ZIP directory lists 'a' twice"),
    (_offset_at_directory(_zip("a")), {"a"}, 100, r"artifact's ZIP directory entry 0 \('a'\) is malformed"),
    (_counted(_zip("a"), 2), {"a", "b"}, 100, r"artifact's ZIP directory ends inside entry 1"),
    (_counted(_zip("a", "b"), 1), {"a", "b"}, 100,
     rf"artifact's ZIP directory holds {DIRECTORY_ENTRY + 1:,} bytes more than its 1 entries"),
    (_zip("a", "b"), {"a", "b"}, 3, r"artifact is too large \(4 bytes, over 3\)"),
], ids=["short", "too many", "trailing byte", "extra field", "compressed", "unexpected long", "unexpected",
        "twice", "offset at the directory", "ends inside", "bytes more", "too large"])
def test_an_artifact_laid_out_otherwise_than_pack_writes_is_refused_saying_how(data, expected, max_bytes, message):
    """Each way a ZIP differs from `pack`'s layout is refused in its own words, a name quoted to its
    first 60 characters, before `zipfile` reads anything."""
    with pytest.raises(GraphError, match=f"^{message}"):
        _entries(data, expected, max_bytes)


def test_an_artifact_laid_out_as_pack_writes_it_lists_its_entries_at_the_bounds() -> None:
    """An empty ZIP (its end record only, 22 bytes) lists nothing; entries as many as expected, of
    exactly `max_bytes` in all, pass, in the directory's order."""
    assert _entries(_zip(), {"a"}, 0) == []
    assert len(_zip()) == _END.size
    assert _entries(_zip("b", "a"), {"a", "b"}, 4) == ["b", "a"]
    assert _entries(_zip(""), {""}, 2) == [""]  # an entry of no name ends exactly where the directory does


@pytest.mark.parametrize("n, bits", [(0, 1), (1, 2), (3, 3), (-1, 2), (255, 9), (256, 10), ((1 << 63) - 1, 64),
                                     (-(1 << 63), 65)])
def test_an_integer_spells_a_sign_and_its_binary_digits(n: int, bits: int) -> None:
    assert int_bits(n) == bits


@pytest.mark.parametrize("x, bits", [(0.1, 1 + 1 + 2), (1e-05, 1 + 1 + 4), (1.5, 1 + 4 + 2), (100.0, 1 + 1 + 3),
                                     (0.0, 1 + 0 + 1), (-2.5, 1 + 5 + 2), (float("inf"), 2), (float("nan"), 2)])
def test_a_float_spells_a_sign_then_its_shortest_decimal_s_digits_and_exponent(x: float, bits: int) -> None:
    """`float_bits`: 1 + bits of the digits M + `int_bits` of the exponent E of M * 10**E (100.0 is 1E+2)."""
    assert float_bits(x) == bits


def test_a_node_s_arguments_spell_each_literal_and_reference_by_its_bits() -> None:
    """What `_Spelling` counts for one node (the 11th value, 3 graph inputs): a list its length, then a
    reference to an input 1 + its place after the last input read, to a node's value 1 + its distance
    back, None and a bool 1, a number its bits, a string 8 a byte, a tag 4; a keyword in the schema its
    place there, one outside it its bytes."""
    spelled = _Spelling(10, ("self", "other", "alpha"), 3, -1)
    spelled.add([_Ref(0), _Ref(2), _Ref(8), _Ref(3), None, True, 5, 1.5, "ab", torch.float32])
    # length 10: 5; input 0 after none read: 1 + 1; input 2 after 0: 1 + 2; value 8 from node 10: 1 + 2;
    # value 3 (the first node's, no input) from node 10: 1 + 4
    assert spelled.bits == 5 + 2 + 3 + 3 + 5 + 1 + 1 + 4 + 7 + 16 + 4
    assert (spelled.operands, spelled.refs, spelled.longest, spelled.last_input) == (10, 4, 2, 2)
    keywords = _Spelling(10, ("self", "other", "alpha"), 3, -1)
    keywords.add_keywords({"alpha": 2, "zz": [_Ref(1)]})
    # 2 keywords: 3; alpha at place 2: 3, then 2: 3; "zz": 16, a list of one: 2, input 1 after none: 1 + 2
    assert keywords.bits == 3 + 3 + 3 + 16 + 2 + 3
    assert (keywords.operands, keywords.refs, keywords.last_input) == (2, 1, 1)


def test_a_tensor_spells_its_dtype_rank_and_sizes_and_with_its_values_its_bytes() -> None:
    x = torch.zeros(3, 256, dtype=torch.int16)
    assert tensor_bits(x, values=False) == 4 + int_bits(2) + int_bits(3) + int_bits(256) == 4 + 3 + 3 + 10
    assert tensor_bits(x, values=True) == 20 + 8 * 3 * 256 * 2
    assert tensor_bits(torch.tensor(1.0), values=True) == 4 + 1 + 32


@pytest.mark.parametrize("depth, refused", [(32, False), (33, True)])
def test_json_nests_at_most_thirty_two_levels(depth: int, refused: bool) -> None:
    """Brackets inside strings and escaped quotes do not count; the 33rd level is refused."""
    text = ("[" * depth + '"]]\\"[["' + "]" * depth).encode()
    if refused:
        with pytest.raises(GraphError, match=r"^x nests deeper than 32 levels$"):
            _json(text, "x")
    else:
        assert _json(text, "x") is not None


def test_json_that_is_not_utf8_or_not_json_is_refused_saying_where() -> None:
    with pytest.raises(GraphError, match=r"^x is not UTF-8 JSON \(invalid start byte at byte 3\)$"):
        _json(b'{"a\xff', "x")
    with pytest.raises(GraphError, match=r"^x is not JSON \(Expecting value: line 1 column 1 \(char 0\)\)$"):
        _json(b"nope", "x")


def _safetensors(header: bytes, size: int | None = None) -> bytes:
    return struct.pack("<Q", len(header) if size is None else size) + header


@pytest.mark.parametrize("body, tensors, message", [
    (b"1234567", 1, r"artifact's w is malformed \(no header\)"),
    (bytes(8), 1, r"artifact's w header is not JSON \(Expecting value: line 1 column 1 \(char 0\)\)"),  # of 0 bytes
    (_safetensors(b"{}", size=3), 1, r"artifact's w header claims 3 bytes, over its file's size"),
    (_safetensors(b" " * 2049), 1, r"artifact's w header claims 2,049 bytes, over the 2,048 a graph of 1 inputs needs"),
    (_safetensors(b"[]"), 1, r"artifact's w header is malformed"),
    (_safetensors(b'{"a": {}, "b": {}}'), 1, r"artifact's w holds 2 tensors, more than its graph's 1 inputs"),
])
def test_a_weight_file_s_header_is_bounded_before_safetensors_reads_it(body: bytes, tensors: int, message: str):
    """A safetensors header: 8 bytes of length at least, a length within the file and within 1,024 bytes
    per tensor the graph takes (plus one), a JSON object of at most that many tensors."""
    with pytest.raises(GraphError, match=f"^{message}$"):
        _header(body, "w", tensors)


def test_a_weight_file_s_header_at_its_bounds_passes() -> None:
    """2,048 bytes for a graph of one input, and one tensor besides the metadata, pass."""
    _header(_safetensors(b" " * 2046 + b"{}"), "w", 1)
    _header(_safetensors(b'{"__metadata__": {}, "a": {}}'), "w", 1)
    _header(_safetensors(b"{}"), "w", 0)


class Holder(nn.Module):
    def __init__(self, name: str, size: int) -> None:
        super().__init__()
        self.register_buffer(name, torch.ones(size))


class Carrier(nn.Module):
    """Buffers `a.zeta` and `z.alpha` and a constant (`lifted_tensor_0`): sorted by their paths, the
    constant falls between the buffers, and by their attribute names `alpha` comes first."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)
        self.z, self.a = Holder("alpha", 3), Holder("zeta", 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x.mean((2, 3))) + self.z.alpha.sum() + self.a.zeta.sum() + torch.tensor([1.0, 2.0]).sum()


def test_what_a_network_carries_is_listed_graphs_first_then_by_kind_and_path() -> None:
    """`carried` names the graphs, then each buffer and constant sorted by its kind, then its path
    (buffers before constants, `a.zeta` before `z.alpha`), then the tensor shapes."""
    net = Carrier()
    graph = export_graph(net, torch.randn(2, 3, 4, 4))
    data = pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")})
    carried = GraphNet(unpack(data, 1 << 30)).carried()
    constants = [n for n in carried if n.startswith("constant ")]
    assert len(constants) == 1 and "a.zeta" < constants[0].removeprefix("constant ") < "z.alpha"
    assert list(carried) == ["the train graph", "the eval graph", "buffer a.zeta", "buffer z.alpha", *constants,
                             "tensor shapes"]
    assert carried["buffer z.alpha"] == 8 * 12 + 4 + 2 + 3 and carried["buffer a.zeta"] == 8 * 8 + 4 + 2 + 3


def test_the_disk_count_takes_each_entry_s_blocks_at_least_a_block_and_follows_no_link(tmp_path: Path) -> None:
    """`_over`: a folder's files by their allocated blocks, each at least 4,096 bytes, its subfolders
    too, but not a folder a link points to (outside: not the child's); over the cap, not at it."""
    from nas.sandbox.verify import _over

    work, outside = tmp_path / "work", tmp_path / "outside"
    (work / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "big").write_bytes(os.urandom(1 << 20))
    (work / "small").write_bytes(b"x")  # one block
    (work / "sub" / "small").write_bytes(b"y")
    (work / "link").symlink_to(outside, target_is_directory=True)
    (work / "file link").symlink_to(outside / "big")
    held = sum(max(os.lstat(p).st_blocks * 512, 4096) for p in (work / "small", work / "sub", work / "sub" / "small",
                                                                  work / "link", work / "file link"))
    assert held < 1 << 20
    assert not _over(str(work), held) and _over(str(work), held - 1)
    assert not _over(str(tmp_path / "missing"), 0)


BOUNDED = [
    ("add", (2, 3), 5), ("add", ((1 << 62), (1 << 62) - 1), (1 << 63) - 1), ("neg", (-((1 << 63) - 1),), (1 << 63) - 1),
    ("pow", (3, 2), 9), ("pow", (2, 62), 1 << 62), ("pow", (2, -1), 0.5), ("pow", (-2, 3), -8), ("mul", (True, 3), 3),
    ("floordiv", (7, 2), 3), ("truediv", (7, 2), 3.5),
    ("add", ((1 << 63), 0), "add takes numbers within int64 range (sizes)"),
    ("add", (-(1 << 63), 0), "add takes numbers within int64 range (sizes)"),
    ("mul", ("ab", 3), "mul takes numbers within int64 range (sizes)"),
    ("add", ((1 << 62), (1 << 62)), "add result outside int64 range"),
    ("mul", (-(1 << 62), 2), "mul result outside int64 range"),
    ("pow", (2, 63), "pow result outside int64 range"), ("pow", (2, 64), "pow result outside int64 range"),
    ("pow", (3, 10**18), "pow result outside int64 range"),
]


@pytest.mark.parametrize("op, args, expected", BOUNDED)
def test_size_arithmetic_takes_and_gives_numbers_within_int64_only(op: str, args: tuple, expected) -> None:
    """A graph's Python operators (`_bounded`): operands and results within int64 (|n| < 2**63), a power
    refused before it is computed when its result would be past 2**64."""
    run = loader._resolve(f"operator.{op}")
    if isinstance(expected, str):
        with pytest.raises(GraphError, match=f"^{re.escape(expected)}$"):
            run(*args)
    else:
        assert run(*args) == expected and type(run(*args)) is type(expected)


def test_getitem_takes_one_output_of_an_operator_returning_several_by_an_integer() -> None:
    getitem = loader._resolve("operator.getitem")
    assert getitem((4, 5), 1) == 5 and getitem([4, 5], -1) == 5
    for values, i in (((4, 5), True), ((4, 5), 1.0), (torch.zeros(3), 0)):
        with pytest.raises(GraphError, match="^getitem takes one output of an operator returning several$"):
            getitem(values, i)


@pytest.mark.parametrize("name, message", [
    (5, "graph operation name malformed"),
    ("os.system", "graph operation 'os.system' not allowed (aten tensor operators only)"),
    ("aten.add.Tensor.x" + "y" * 80, f"graph operation {('aten.add.Tensor.x' + 'y' * 80)[:60]!r} not allowed (aten "
                                     "tensor operators only)"),
    ("aten.as_strided.default", "graph operation 'aten.as_strided.default' not allowed (not among the operators a "
                                "model may use, or one that writes into its arguments: nas/sandbox/aten_ops.py)"),
    ("aten.split.str", "graph operation 'aten.split.str' not allowed (takes a string)"),
])
def test_a_graph_operation_is_an_allowed_aten_operator_or_a_size_operator(name, message) -> None:
    with pytest.raises(GraphError) as refused:
        loader._resolve(name)
    assert str(refused.value) == message


def test_an_allowed_operator_resolves_to_itself_and_the_empty_family_zero_filled() -> None:
    assert loader._resolve("aten.add.Tensor") is torch.ops.aten.add.Tensor
    assert loader._resolve("aten.div.Tensor_mode") is torch.ops.aten.div.Tensor_mode  # a string option
    assert loader._resolve("aten.empty.memory_format").__name__ == "empty.memory_format (zero-filled)"


@pytest.mark.parametrize("value, message", [
    ({LONG: "x"}, f"graph argument {LONG[:40]}='x' not allowed"),
    ({"dtype": "y" * 100}, f"graph argument dtype={'y' * 40!r} not allowed"),
    ({"dtype": ["torch.float32"]}, "graph argument dtype=\"['torch.float32']\" not allowed"),
    ({"ref": 1}, "graph refers to value 1 before it is defined"),
    ({"ref": 10 ** 30}, f"graph refers to value {str(10 ** 30)[:20]} before it is defined"),
    ({"a": 1, "b": 2}, "graph argument malformed"),
])
def test_a_tagged_argument_names_its_tag_and_value_cut_at_forty_characters(value, message) -> None:
    with pytest.raises(GraphError) as refused:
        net([node("aten.relu.default", value)])
    assert str(refused.value) == message


def test_an_aten_operator_s_arguments_are_named_by_its_schema_and_a_python_operator_s_by_none() -> None:
    """A keyword is spelled by its place in the schema; a Python operator has no schema, so its
    keywords are spelled out (and counting them never raises)."""
    assert loader._argument_names("aten.add.Tensor") == ("self", "other", "alpha")
    assert loader._argument_names("operator.getitem") == ()
    spelled = _Spelling(0, loader._argument_names("operator.getitem"), 1, -1)
    spelled.add_keywords({"key": 1})
    assert spelled.bits == int_bits(1) + 8 * 3 + int_bits(1)
    named = _Spelling(0, loader._argument_names("aten.add.Tensor"), 1, -1)
    named.add_keywords({"alpha": 1})
    assert named.bits == int_bits(1) + int_bits(2) + int_bits(1)
    bare = net([node("operator.getitem", X, 0)]).programs["eval"].bits
    keyed = net([node("operator.getitem", X, 0, key=1)]).programs["eval"].bits
    assert keyed - bare == int_bits(1) + 8 * 3 + int_bits(1) - int_bits(0)


@pytest.mark.parametrize("bits, parameters", [(0, 0), (1 << 17, 0), ((1 << 17) + 1, 1), ((1 << 17) + 32, 1),
                                              ((1 << 17) + 33, 2)])
def test_bits_past_the_free_ones_count_as_a_parameter_per_32_rounded_up(bits: int, parameters: int) -> None:
    assert loader.carried_parameters(bits) == parameters


def test_the_worker_s_clocks_grow_with_the_artifact_s_bytes_and_the_dry_run_s_runs() -> None:
    """Unpacking: 30 s and 0.1 s a MB; a dry run: 30 s and 1e-4 s per unit of the graphs' cost per run,
    one run at the verification batch, two with a larger training batch."""
    from nas.sandbox.graph import unpack_seconds

    assert unpack_seconds(0) == 30.0 and unpack_seconds(10**7) == pytest.approx(31.0)
    net = Carrier()
    graph = export_graph(net, torch.randn(2, 3, 4, 4))
    g = GraphNet(unpack(pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")}), 1 << 30))
    assert g.cost == sum(p.cost for p in g.programs.values()) > 0
    one, two = 30.0 + g.cost * 1e-4, 30.0 + 2 * g.cost * 1e-4
    assert [g.dry_run_seconds(t) for t in (0, 1, 2, 3, 256)] == pytest.approx([one, one, one, two, two])


def test_a_dry_run_meters_the_bytes_of_new_tensors_not_views_within_their_base_nor_inputs_returned() -> None:
    """`_Meter.take`: a new tensor's bytes count; a view no larger than its base, or an input handed back
    (in place), does not; an expanded view counts whole; past the budget, refused naming the operator."""
    from nas.sandbox.graph import _Meter

    meter = _Meter(1000, "for a test")
    x = torch.zeros(10)  # 40 bytes
    meter.take("op", torch.zeros(25), ((x,), {}))
    assert meter.used == 100
    meter.take("op", x[:5], ((x,), {}))
    meter.take("op", x, ((x,), {}))
    assert meter.used == 100
    meter.take("op", x[:1].expand(100), ((x,), {}))
    assert meter.used == 100 + 400
    meter.take("op", torch.zeros(125), ((x,), {}))
    assert meter.used == 1000
    with pytest.raises(GraphError, match=r"^graph needs over 0 MB for a test \(at aten\.add\.Tensor\)$"):
        meter.take(torch.ops.aten.add.Tensor, torch.zeros(1), ((x,), {}))


class _Signed:
    """What `compare` reads of a network: its layers' parameter shapes and its operations."""

    def __init__(self, ops: str | list[str], layers: tuple[str, ...] = ("[[4, 3]]",)) -> None:
        self.ops, self.layers = list(ops), list(layers)

    def signature(self) -> tuple[list[str], list[str]]:
        return self.layers, self.ops


@pytest.mark.parametrize("old, new, expected", [
    ("abc", "abc", (False, 0)),
    ("abc", "abd", (True, 1)),    # the last operation replaced: the common end stops before it
    ("abc", "xbc", (True, 1)),    # the first replaced: the common start stops before it
    ("abc", "axbc", (True, 1)),   # one inserted in the middle
    ("abc", "ab", (True, 1)),     # one deleted at the end
    ("abc", "bc", (True, 1)),     # one deleted at the start
    ("ab", "cd", (True, 2)),
    ("abcb", "abdb", (True, 1)),  # the common end is one operation, then the changed one
    ("", "ab", (True, 2)),
])
def test_compare_counts_the_operations_changed_between_the_common_start_and_end(old, new, expected) -> None:
    assert loader.compare(_Signed(old), _Signed(new)) == expected
    assert loader.compare(_Signed(new), _Signed(old)) == expected


def test_compare_sees_a_change_of_layers_alone_and_counts_no_operation() -> None:
    assert loader.compare(_Signed("abc"), _Signed("abc", ("[[8, 3]]",))) == (True, 0)


def test_past_its_pairs_compare_counts_what_one_side_has_and_the_other_lacks(monkeypatch) -> None:
    monkeypatch.setattr(loader, "MAX_DIFF_PAIRS", 8)
    # middles "bcd" vs "dcb": 9 pairs, over 8: the operations in common are counted, not their order
    assert loader.compare(_Signed("abcde"), _Signed("adcbe")) == (False, 0)
    assert loader.compare(_Signed("abcde"), _Signed("axcye")) == (True, 2)
    monkeypatch.setattr(loader, "MAX_DIFF_PAIRS", 9)  # 9 pairs, within it: difflib's edits, in order
    assert loader.compare(_Signed("abcde"), _Signed("adcbe")) == (True, 4)  # "dc" inserted, "cd" deleted


@pytest.mark.parametrize("first, exact", [(2048, True), (2049, False)])
def test_compare_matches_in_order_up_to_two_to_the_24_pairs_and_counts_linearly_past_them(first, exact) -> None:
    """Two blocks swapped: difflib (within `MAX_DIFF_PAIRS`, 1 << 24: 4096 x 4096) keeps the longer
    and deletes and inserts the other; past it (4097 x 4097) the same operations count as none."""
    a, b = [f"a{i}" for i in range(first)], [f"b{i}" for i in range(2048)]
    changed, edits = loader.compare(_Signed(a + b), _Signed(b + a))
    assert len(a + b) ** 2 <= 1 << 24 if exact else len(a + b) ** 2 > 1 << 24
    assert (changed, edits) == ((True, 2 * 2048) if exact else (False, 0))


@pytest.mark.parametrize("kind, used, value, expected", [
    ("BUFFER", {"running_mean"}, torch.zeros(3), "running_mean"),
    ("BUFFER", {"running_var"}, torch.ones(3), "running_var"),
    ("BUFFER", {"counter"}, torch.tensor(5), "counter"),
    ("BUFFER", {"counter"}, torch.tensor([5]), "counter"),
    ("BUFFER", {"counter"}, torch.tensor(5.0), None),       # a float: a value of the model's
    ("BUFFER", {"counter"}, torch.tensor([5, 6]), None),    # more than a step counter
    ("BUFFER", {"running_mean", "weight"}, torch.zeros(3), None),  # used as something else too
    ("BUFFER", {"weight"}, torch.zeros(3), None),
    ("CONSTANT", {"running_mean"}, torch.zeros(3), None),
    ("BUFFER", {"running_mean"}, None, None),               # no such slot
])
def test_only_a_buffer_used_as_one_normalisation_statistic_or_step_counter_is_the_data_s(
        kind, used, value, expected) -> None:
    """`GraphNet._statistics`: the buffers whose values training redraws (`carried` counts their shape only)."""
    import types

    holder = types.SimpleNamespace(t=value)
    net = types.SimpleNamespace(_slots={} if value is None else {(kind, "b"): (holder, "t")})
    assert GraphNet._statistics(net, {(kind, "b"): used}) == ({} if expected is None else {(kind, "b"): expected})


@pytest.mark.parametrize("train_batch, over, refused", [
    (0, 0, None), (0, 1, "eval graph needs 5e+10 operations for one forward pass of 2 images, over the limit of 5e+10"),
    (8, 0, None), (8, 1, "eval graph needs 2e+11 operations for one forward pass of 8 images, over the limit of 2e+11"),
])
def test_a_dry_run_holds_each_graph_to_max_work_per_batch_scaled_to_the_training_s(
        monkeypatch, train_batch, over, refused) -> None:
    """`GraphNet.dry_run` at batch 2 (and at `train_batch` when larger): each graph's work at most
    `MAX_WORK` x (size / batch), one operation more refused; the output shape at batch 2 and the
    eval graph's work at the larger size come back."""
    import types

    class Work:
        total = 0

    class Meter:
        said: list[str] = []

        def __init__(self, budget, says) -> None:
            self.said.append(says)

        training = classmethod(lambda cls, *args: object.__new__(cls))

    def meta_run(program, size, meter, work):
        work.total = int(loader.MAX_WORK * size / 2) + (over if program == "eval" and size == max(2, train_batch) else 0)
        return torch.empty(size, 10)

    monkeypatch.setattr(loader, "WorkCounter", Work)
    monkeypatch.setattr(loader, "_Meter", Meter)
    net = types.SimpleNamespace(programs={"train": "train", "eval": "eval"}, _meta_run=meta_run)
    if refused is not None:
        with pytest.raises(GraphError, match=f"^{re.escape(refused)}$"):
            GraphNet.dry_run(net, 2, 1 << 30, train_batch)
        return
    shape, work = GraphNet.dry_run(net, 2, 1 << 30, train_batch)
    assert shape == [2, 10] and work.total == int(loader.MAX_WORK * max(2, train_batch) / 2)
    assert Meter.said == [f"for an evaluation pass of {size} images (over the trainer's 1024 MB)"
                          for size in sorted({2, max(2, train_batch)})]
    net._meta_run = lambda program, size, meter, work: torch.empty(size, 10 if program == "train" else 9)
    with pytest.raises(GraphError, match=r"^train and eval graphs disagree on the output shape \(\[2, 10\] vs \[2, 9\]\)$"):
        GraphNet.dry_run(net, 2, 1 << 30, train_batch)


@pytest.mark.parametrize("norm", [nn.BatchNorm2d(4), nn.InstanceNorm2d(4, affine=True, track_running_stats=True)],
                         ids=["batch", "instance"])
def test_a_normalisation_s_running_statistics_are_known_by_their_places_and_carry_only_their_shapes(norm) -> None:
    """Each statistic is found at its operator's place in both graphs (eval and train spell it at
    different operators), so neither is counted by its values."""
    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.conv, self.norm, self.fc = nn.Conv2d(3, 4, 3, padding=1), norm, nn.Linear(4, 10)

        def forward(self, x):
            return self.fc(self.norm(self.conv(x)).mean((2, 3)))

    net = Net()
    graph = export_graph(net, torch.randn(2, 3, 8, 8))
    art = unpack(pack(graph, {"init": dict(net.state_dict()), "const": graph.pop("constants")}), 1 << 30)
    loaded = GraphNet(art)
    roles = {target: used for (kind, target), used in loaded._roles().items() if kind == "BUFFER"}
    assert roles["norm.running_mean"] == {"running_mean"} and roles["norm.running_var"] == {"running_var"}
    assert not [name for name in loaded.carried() if name.startswith("buffer norm.running")]
