"""Trace, then train (nas.sandbox.graph): exported graph data is rebuilt here
with aten operators only, and a forged or hostile artifact is refused."""

from __future__ import annotations

import io
import json
import re
import zipfile

import pytest
import torch
from torch import nn

from nas.measure import count_flops, count_params
from nas.sandbox.aten_ops import WorkCounter
from nas.sandbox.graph import GRAPH_FILE, GraphError, GraphNet, compare, export_graph, pack, unpack
from nas.sandbox.limits import Limits


class Small(nn.Module):
    def __init__(self, num_classes: int = 10, kernel: int = 3) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, kernel, padding=kernel // 2, bias=False)
        self.bn = nn.BatchNorm2d(8)
        self.drop = nn.Dropout(0.5)
        self.fc = nn.Linear(8, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.relu(self.bn(self.conv(x))) * torch.tensor(2.0)
        return self.fc(self.drop(x.mean((2, 3))).view(x.size(0), -1))


def artifact(net: nn.Module, shape=(2, 3, 16, 16)) -> bytes:
    tensors = {k: v.detach().clone() for k, v in [*net.named_parameters(), *net.named_buffers()]}
    graph = export_graph(net, torch.randn(shape))
    return pack(graph, {"init": tensors, "const": graph.pop("constants")})


def rebuilt(net: nn.Module) -> GraphNet:
    return GraphNet(unpack(artifact(net), 1 << 28))


def test_rebuilt_network_matches_the_original() -> None:
    torch.manual_seed(0)
    net, x = Small(), torch.randn(5, 3, 16, 16)  # another batch size than the export's
    g = rebuilt(net)
    assert count_params(g) == count_params(net) and g.layers() == 3
    assert count_flops(g, (1, 3, 16, 16)) == count_flops(net, (1, 3, 16, 16))
    net.eval(), g.eval()
    assert torch.equal(net(x), g(x))
    g.train()
    g(x).sum().backward()  # trains: gradients reach the parameters, BN statistics move
    assert g.fc.weight.grad is not None and int(g.bn.num_batches_tracked) == 1


def test_dry_run_bounds_memory_on_the_meta_device() -> None:
    g = rebuilt(Small())
    assert g.dry_run(2, 1 << 30)[0] == [2, 10]
    with pytest.raises(GraphError, match="needs over 0 MB"):
        g.dry_run(4096, 1 << 19)


def test_compare_counts_changed_operations() -> None:
    torch.manual_seed(0)
    a, b = rebuilt(Small()), rebuilt(Small())
    assert compare(a, b) == (False, 0)
    assert compare(a, rebuilt(Small(kernel=5))) == (True, 1)


def _tamper(data: bytes, edit) -> bytes:
    """Rewrite the graph JSON of an artifact as an attacker in the sandbox could."""
    src = zipfile.ZipFile(io.BytesIO(data))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        for info in src.infolist():
            body = src.read(info)
            if info.filename == GRAPH_FILE:
                graph = json.loads(body)
                edit(graph)
                body = json.dumps(graph).encode()
            zf.writestr(info.filename, body)
    return out.getvalue()


def _first_op(graph: dict, op: str) -> None:
    graph["train"]["nodes"][0]["op"] = op


@pytest.mark.parametrize("edit, error", [
    (lambda g: _first_op(g, "aten.from_file.default"), "not allowed"),
    (lambda g: _first_op(g, "aten.save.default"), "not allowed"),
    (lambda g: _first_op(g, "aten.as_strided.default"), "not allowed"),
    (lambda g: _first_op(g, "builtins.eval"), "not allowed"),
    (lambda g: _first_op(g, "aten.no_such_op.default"), "not allowed"),
    (lambda g: _first_op(g, "aten.add.no_such_overload"), "not allowed"),
    (lambda g: _first_op(g, "aten._reshape_alias.default"), "not allowed"),  # any sizes and strides: heap access
    (lambda g: _first_op(g, "aten._reshape_alias_copy.default"), "not allowed"),
    (lambda g: _first_op(g, "aten.add.out"), "not allowed"),  # resizes the tensor passed as out=
    (lambda g: _first_op(g, "os.system"), "not allowed"),
    (lambda g: g["train"]["nodes"][0]["args"].__setitem__(0, {"ref": 10**6}), "before it is defined"),
    (lambda g: g["train"]["nodes"][0]["args"].__setitem__(0, {"pickle": "x"}), "not allowed"),
    (lambda g: g["train"]["nodes"][0]["args"].__setitem__(0, {"dtype": [1]}), "not allowed"),  # unhashable tag value
    (lambda g: g["train"]["nodes"][0]["args"].__setitem__(0, {"memory_format": {"a": 1}}), "not allowed"),
    (lambda g: g.__setitem__("format", 99), "unknown graph format"),
    (lambda g: g["train"].__setitem__("outputs", []), "exactly one tensor"),
    (lambda g: g.__setitem__("input_shape", [3, 10**6, 1]), "input shape"),
])
def test_hostile_graph_data_is_refused(edit, error: str) -> None:
    data = _tamper(artifact(Small()), edit)
    with pytest.raises(GraphError, match=error):
        GraphNet(unpack(data, 1 << 28))


def test_hostile_containers_are_refused() -> None:
    good = artifact(Small())
    with pytest.raises(GraphError, match="malformed"):
        unpack(b"not a zip", 1 << 20)
    with pytest.raises(GraphError, match="too large"):
        unpack(good, 100)
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as zf:
        zf.writestr(GRAPH_FILE, "{}")
        zf.writestr("weights.pkl", b"\x80\x04K\x01.")
    with pytest.raises(GraphError, match="unexpected files"):
        unpack(out.getvalue(), 1 << 20)
    wrong = _tamper(good, lambda g: None)
    art = unpack(wrong, 1 << 28)
    art.weights["init"]["fc.weight"] = art.weights["init"].pop("conv.weight")
    with pytest.raises(GraphError, match="lacks the tensor|do not match"):
        GraphNet(art)


@pytest.mark.parametrize("target, error", [("../../etc", "malformed"), ("__class__", "defined twice"),
                                           ("training", "defined twice"), ("forward.x", "clashes")])
def test_tensor_paths_cannot_reach_attributes(target: str, error: str) -> None:
    art = unpack(artifact(Small()), 1 << 28)
    old = art.graph["train"]["inputs"][0]["target"]
    for mode in ("train", "eval"):
        art.graph[mode]["inputs"][0]["target"] = target
    art.weights["init"][target] = art.weights["init"].pop(old)
    with pytest.raises(GraphError, match=error):
        GraphNet(art)


def _node(op: str, *args) -> dict:
    return {"op": op, "args": list(args), "kwargs": {"map": {}}}


def _append(nodes) -> callable:
    """An edit adding `nodes(first)` to both graphs (`first`: the ref the first added node gets)
    and returning the last added value."""
    def edit(graph: dict) -> None:
        for mode in ("train", "eval"):
            g = graph[mode]
            first = len(g["inputs"]) + len(g["nodes"])
            g["nodes"] += nodes(first)
            g["outputs"] = [{"ref": len(g["inputs"]) + len(g["nodes"]) - 1}]
    return edit


def test_a_graph_that_asks_for_hours_of_compute_is_refused_before_it_runs() -> None:
    """Two constant images and 2,000 convolutions of one by the other: tiny outputs, ~1e10
    multiply-accumulates each. The dry run counts them on the meta device, computing nothing."""
    def nodes(first: int) -> list[dict]:
        conv = _node("aten.convolution.default", {"ref": first}, {"ref": first + 1}, None, [1, 1], [0, 0], [1, 1],
                     False, [0, 0], 1)
        return [_node("aten.ones.default", [1, 1, 2048, 2048]), _node("aten.ones.default", [1, 1, 2000, 2000]),
                *[conv] * 2000, _node("aten.zeros.default", [2, 10])]

    net = GraphNet(unpack(_tamper(artifact(Small()), _append(nodes)), 1 << 28))
    with pytest.raises(GraphError, match=r"train graph needs 1\.\d+e\+13 operations .* over the limit"):
        net.dry_run(2, 1 << 30)
    assert rebuilt(Small()).dry_run(2, 1 << 30)[1].macs > 0  # the model itself passes


class Upsampled(nn.Module):
    """Hostile: a 1023-wide max pool (stride 1, padding 511) after an upsample to 1024x1024: ~10^12
    comparisons an image, while it reads and writes ~10^6 elements."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.interpolate(x.mean(1, keepdim=True), size=(1024, 1024))
        return self.fc(x.mean((2, 3))) + nn.functional.max_pool2d(h, 1023, stride=1, padding=511).mean() * 0


def test_a_pool_is_counted_by_its_window_not_its_elements() -> None:
    with pytest.raises(GraphError, match=r"train graph needs \d\.\d+e\+12 operations .* over the limit"):
        rebuilt(Upsampled()).dry_run(2, 1 << 30)


def _meta(*shape: int) -> torch.Tensor:
    return torch.empty(shape, device="meta")


@pytest.mark.parametrize("call, field, units", [
    (lambda: nn.functional.max_pool2d(_meta(1, 1, 64, 64), 31, stride=1, padding=15), "other", 64 * 64 * 31 * 31),
    (lambda: nn.functional.avg_pool2d(_meta(1, 1, 64, 64), [31, 15], stride=1, padding=[15, 7]), "other",
     64 * 64 * 31 * 15),
    (lambda: nn.functional.max_pool1d(_meta(1, 1, 4096), 255, stride=1, padding=127, return_indices=True)[0],
     "other", 4096 * 255),
    (lambda: nn.functional.adaptive_max_pool2d(_meta(1, 1, 64, 64), 63), "other", 63 * 63 * 3 * 3),
    (lambda: _meta(4, 1024).sort(), "other", 4 * 1024 * 10),  # n log2 n per row
    (lambda: _meta(4, 1024).topk(3), "other", 4 * 1024 * 10),
    (lambda: nn.functional.interpolate(_meta(1, 1, 8, 8), size=(32, 32), mode="bicubic"), "other", 32 * 32 * 16),
    (lambda: torch.addbmm(_meta(8, 8), _meta(1, 8, 16).expand(64, 8, 16), _meta(1, 16, 8).expand(64, 16, 8)),
     "macs", 64 * 8 * 16 * 8),
    (lambda: nn.functional.bilinear(_meta(4, 8), _meta(4, 6), _meta(5, 8, 6)), "macs", 4 * 5 * 8 * 6),
    (lambda: nn.functional.conv_transpose2d(_meta(1, 1, 4, 4), _meta(1, 1, 1, 1), stride=64), "traffic",
     193 * 193),  # its output, which it writes (mostly zeros) however few products it has
])
def test_work_counts_each_operator_by_its_formula(call, field: str, units: int) -> None:
    """Operators whose cost is not the elements they read or write: a pool's window times its output,
    n log n for a sort, an interpolation's taps, products torch has no FLOP formula for, and what a
    transposed convolution writes (besides the views around it, a few elements each)."""
    with WorkCounter() as work:
        call()
    assert units <= getattr(work, field) < 1.25 * units


class Stacked(nn.Module):
    """1x1 convolutions at 512x512: ~67 MB of tensors an image, ~17 GB at the training batch of 256."""

    def __init__(self) -> None:
        super().__init__()
        self.convs = nn.ModuleList([nn.Conv2d(3, 8, 1), *(nn.Conv2d(8, 8, 1) for _ in range(3))])
        self.fc = nn.Linear(8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = nn.functional.interpolate(x, size=(512, 512))
        for conv in self.convs:
            h = conv(h).relu()
        return self.fc(h.mean((2, 3)))


def test_a_training_step_must_fit_the_trainers_memory_at_the_training_batch() -> None:
    """The budget is what the trainer has, whatever the batch (it was scaled by the batch: a stack
    like this one at 1024x1024 passed with ~390 GB of forward tensors at batch 256)."""
    g = rebuilt(Stacked())
    assert g.dry_run(2, 1 << 30)[0] == [2, 10]
    with pytest.raises(GraphError, match=r"needs over 511 MB for the forward of a training step of 256 images"):
        g.dry_run(2, 1 << 30, 256)
    with pytest.raises(GraphError, match="parameters need 0 MB to train .* over the trainer's 0 MB"):
        g.dry_run(2, 1 << 10)


def test_uninitialised_memory_is_zero_filled() -> None:
    """`empty` would hand the graph whatever this process's heap held; it runs zero-filled."""
    data = _tamper(artifact(Small()), _append(lambda first: [_node("aten.empty.memory_format", [2, 10])]))
    net = GraphNet(unpack(data, 1 << 28))
    assert net.dry_run(2, 1 << 30)[0] == [2, 10]
    assert torch.equal(net(torch.randn(2, 3, 16, 16)), torch.zeros(2, 10))


def test_the_dry_run_computes_nothing_even_where_the_graph_names_a_device() -> None:
    ones = {"op": "aten.ones.default", "args": [[2, 10]], "kwargs": {"map": {"device": "cpu"}}}
    net = GraphNet(unpack(_tamper(artifact(Small()), _append(lambda first: [ones])), 1 << 28))
    with pytest.raises(GraphError, match="names a device other than its input's"):
        net.dry_run(2, 1 << 30)


class Wide(nn.Module):
    """Small's graph, with `width` channels: no size in the graph names the width."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, width, 3, padding=1)
        self.fc = nn.Linear(width, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.conv(x)).mean((2, 3)))


def test_a_training_seed_gets_the_checked_networks_shapes() -> None:
    """A model that makes its training instances wider than the checked one (a counter in
    `__init__`) would be measured small and trained large: the seed's weights must match."""
    from nas.sandbox.verify import _graph_verdict

    small, wide = Wide(8), Wide(512)
    graph = export_graph(small, torch.randn(2, 3, 16, 16))
    weights = {"init": dict(small.state_dict()), "seed0": dict(wide.state_dict()), "const": graph.pop("constants")}
    verdict = _graph_verdict(pack(graph, weights), 10, (2, 3, 16, 16), Limits(), False, [0])
    assert not verdict.ok and "'seed0' differs from 'init'" in verdict.error
    weights["seed0"] = {k: v.double() for k, v in small.state_dict().items()}
    assert "differs" in _graph_verdict(pack(graph, weights), 10, (2, 3, 16, 16), Limits(), False, [0]).error
    weights["seed0"] = dict(Wide(8).state_dict())
    assert _graph_verdict(pack(graph, weights), 10, (2, 3, 16, 16), Limits(), False, [0]).ok


@pytest.mark.parametrize("node", [
    _node("operator.pow", 7, 10**12),                     # hours and gigabytes of Python int arithmetic
    _node("operator.mul", [0], 10**12),                   # a list of 10**12 elements
    _node("operator.mul", 2**62, 2**62),
    _node("operator.add", 2**70, 1),
    _node("operator.getitem", {"ref": 0}, 0),             # only an operator's outputs are indexed
])
def test_size_arithmetic_stays_within_int64(node: dict) -> None:
    net = GraphNet(unpack(_tamper(artifact(Small()), _append(lambda first: [node, _node("aten.zeros.default",
                                                                                        [2, 10])])), 1 << 28))
    with pytest.raises(GraphError, match="int64|getitem"):
        net.dry_run(2, 1 << 30)


def test_graph_json_is_size_capped() -> None:
    """32 MB of JSON numbers would be gigabytes of Python objects here."""
    data = _tamper(artifact(Small()), lambda g: g.__setitem__("pad", [0.5] * (9 << 20)))
    with pytest.raises(GraphError, match="graph is over 32 MB"):
        unpack(data, 1 << 30)


class Batched(nn.Module):
    """Small plus `mix`, work a hostile model hides from the FLOPs count."""

    def __init__(self, mix: str) -> None:
        super().__init__()
        self.mix = mix
        self.conv = nn.Conv2d(3, 16, 3, padding=1, bias=False)
        self.w = nn.Parameter(torch.randn(16, 16) * 0.1)
        self.fc = nn.Linear(16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        t = torch.relu(self.conv(x)).flatten(2).transpose(1, 2)  # B, HW, 16
        if self.mix == "baddbmm":  # fvcore counted no baddbmm: 8 x 256 x 16 x 16 MACs per image hidden
            for _ in range(8):
                t = torch.baddbmm(t, t, self.w.expand(t.shape[0], 16, 16))
        elif self.mix == "outer":  # the flattened batch's outer product: (B * 48)^2 at batch B
            v = x[:, :, :4, :4].reshape(-1)
            t = t + (v[:, None] * v[None, :]).mean()
        elif self.mix == "gram":  # images attend to each other: B^2 * 4096 MACs at batch B
            flat = t.reshape(t.shape[0], -1)
            t = t + (flat @ flat.t() @ flat).reshape(t.shape) * 1e-6
        return self.fc(t.mean(1))


@pytest.mark.parametrize("mix, error", [
    ("outer", r"operations per image \(at batch 256\) outside"),
    ("gram", "multiply-accumulates per image at batch 256"),
])
def test_work_growing_faster_than_the_batch_is_refused(mix: str, error: str) -> None:
    """Cheap at the verification batch of 2, quadratic at the training batch: the dry run
    checks the cost per image at the training batch too."""
    from nas.sandbox.verify import _graph_verdict

    data = artifact(Batched(mix))
    assert GraphNet(unpack(data, 1 << 28)).dry_run(2, 1 << 30)[1].other < 10**6
    verdict = _graph_verdict(data, 10, (2, 3, 16, 16), Limits(), False)
    assert not verdict.ok and re.search(error, verdict.error)


def test_products_fvcore_has_no_handle_for_are_counted() -> None:
    from nas.sandbox.verify import _graph_verdict

    net = Batched("baddbmm")
    verdict = _graph_verdict(artifact(net), 10, (2, 3, 16, 16), Limits(), False)
    hidden = 8 * 256 * 16 * 16
    assert verdict.ok and verdict.flops == count_flops(net, (1, 3, 16, 16)) >= hidden


@pytest.mark.parametrize("net, error", [
    (Batched("outer"), r"operations per image \(at batch 256\) outside .* more than the [\d,]+ FLOPs it could count"),
    (Stacked(), "for the forward of a training step of 256 images"),
])
def test_refusals_decidable_on_shapes_come_before_any_real_compute(net: nn.Module, error: str,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """Work and memory are refused on the meta device, before this process runs the graph for real
    (a forward, a backward, fvcore's trace), which a refused graph may make take hours or gigabytes."""
    from nas.sandbox.verify import _graph_verdict

    def ran(*args, **kwargs):
        raise AssertionError("ran the graph for real")

    monkeypatch.setattr(GraphNet, "forward", ran)
    monkeypatch.setattr("nas.measure.count_flops", ran)
    verdict = _graph_verdict(artifact(net), 10, (2, 3, 16, 16), Limits(), False)
    assert not verdict.ok and re.search(error, verdict.error), verdict.error


class Banked(nn.Module):
    """Hostile: a frozen 'pre-trained' filter bank run by `F.conv2d` from a buffer named like BatchNorm
    statistics, and a lifted constant table: capacity that `parameters()` does not show."""

    def __init__(self, bank: int = 64) -> None:
        super().__init__()
        self.norm = nn.Module()
        self.norm.register_buffer("running_var", torch.randn(bank, 3, 3, 3), persistent=False)
        self.table = torch.randn(10, bank)  # a plain attribute: torch.export lifts it as a constant
        self.bn = nn.BatchNorm1d(bank)
        self.fc = nn.Linear(bank, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = self.bn(nn.functional.conv2d(x, self.norm.running_var, padding=1).relu().mean((2, 3)))
        return self.fc(f) + f @ self.table.t()


def test_buffers_and_constants_count_by_their_bytes() -> None:
    """A buffer or constant the graph reads counts its bytes (8 bits each) with its shape and dtype,
    whatever its name; BatchNorm's statistics (found by how the graph uses them) count their shapes
    only, their values being redrawn. Past FREE_BITS the rest counts as parameters, 32 bits to one;
    past MAX_BITS the graph is refused in one line."""
    from nas.sandbox.graph import FREE_BITS, MAX_BITS, carried_parameters
    from nas.sandbox.verify import _graph_verdict

    g = rebuilt(Banked(bank=128))
    carried = g.carried()
    # float32 [128, 3, 3, 3]: 13,824 bytes; dtype 4 bits, rank 4 -> 4, sizes 128 -> 9 and 3 -> 3 each
    assert carried["buffer norm.running_var"] == 8 * 13_824 + 4 + 4 + 9 + 3 * 3
    assert carried["constant table"] == 8 * 5_120 + 4 + 3 + 5 + 9  # float32 [10, 128]
    assert not any("bn." in name for name in carried)  # the statistics' values: training's, not the code's
    bits = sum(carried.values())
    assert FREE_BITS < bits <= MAX_BITS
    assert count_params(g) == count_params(Banked(bank=128)) + carried_parameters(bits) > count_params(Banked(128))
    assert carried_parameters(bits) == -(-(bits - FREE_BITS) // 32)
    assert count_params(rebuilt(Small())) == count_params(Small())  # BN statistics, a lifted scalar
    verdict = _graph_verdict(artifact(Banked(bank=1024)), 10, (2, 3, 16, 16), Limits(), False)
    assert verdict.stage == "graph" and re.fullmatch(
        r"graph: carries [\d,]+ bits besides its input and trainable parameters .* most in buffers and constants "
        r"\(2 tensors\): [\d,]+ bits, the largest buffer norm\.running_var with [\d,]+\), over the "
        rf"{MAX_BITS:,} allowed: .*", verdict.error), verdict.error


class Spelled(nn.Module):
    """Hostile: a frozen 'pre-trained' layer held in the graph itself, no tensor attribute at all:
    one weight per `mul(x, w)` (`table=False`), or a table laid out by `cat` of references to a
    few constants (`table=True`: 16 levels, a quantised network's weights)."""

    def __init__(self, weights: int, table: bool) -> None:
        super().__init__()
        self.weights, self.table = weights, table
        self.fc = nn.Linear(4, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        f = x.mean((2, 3)).flatten(1)
        if self.table:
            levels = [torch.full((1,), (i - 8) / 8) for i in range(16)]
            w = torch.cat([levels[(i * 7) % 16] for i in range(self.weights)]).view(-1, 3)
            frozen = f @ w.t()
        else:
            frozen = sum(f[:, i % 3:i % 3 + 1] * ((i * 7) % 16 - 8) / 8 for i in range(self.weights))
        return self.fc(torch.cat([f, frozen.mean(1, keepdim=True)], 1))


def _spelled(g: GraphNet) -> int:
    return g.carried()["the train graph"] + g.carried()["the eval graph"]


@pytest.mark.parametrize("table", [False, True])
def test_values_spelled_out_in_the_graph_count_their_bits(table: bool) -> None:
    """A table held in the graph itself, one weight of 16 levels per `mul(x, w)` or as `cat` of
    references to 16 constants, carries at least its information (4 bits a weight, in the train and
    the eval graph): each literal counts its bits and each reference its choice of value."""
    weights = 600
    grown = _spelled(rebuilt(Spelled(3 + weights, table))) - _spelled(rebuilt(Spelled(3, table)))
    assert grown >= 2 * weights * 4


class Picked(nn.Module):
    """Hostile: a frozen table of `picks` values of 15 levels, each picked by a literal index (`form`:
    select, narrow, slice, or a value of `unbind` in a list), from levels tainted by the input so no
    value is a constant of the model's."""

    def __init__(self, form: str, picks: int) -> None:
        super().__init__()
        self.form, self.codes = form, [(i * 7) % 15 + 1 for i in range(picks)]
        self.fc = nn.Linear(3, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        levels = (torch.arange(16) - 8) / 8 + 0 * x.sum()
        if self.form == "select":
            table = torch.stack([levels[c] for c in self.codes])
        elif self.form == "narrow":
            table = torch.cat([levels.narrow(0, c, 1) for c in self.codes])
        elif self.form == "slice":
            table = torch.cat([levels[c:c + 1] for c in self.codes])
        else:
            values = levels.unbind(0)
            table = torch.stack([values[c] for c in self.codes])
        return self.fc(x.mean((2, 3))) + table.mean()


@pytest.mark.parametrize("form", ["select", "narrow", "slice", "unbind"])
def test_values_picked_by_literal_indices_count_however_tainted(form: str) -> None:
    """A table spelled as picks from 16 levels (`select.int(levels, 0, k)`, a narrow, a slice, a value
    of `unbind`, over levels tainted by `0 * sum(x)`) carries at least 4 bits a pick, in both graphs,
    whatever operator picks: no operator's index arguments are taken for structure."""
    picks = 40
    one, more = (_spelled(rebuilt(Picked(form, 1 + n))) for n in (0, picks))
    assert more - one >= 2 * 4 * picks


class Smuggled(Small):
    """Hostile: `__init__` loads weights embedded in the source (a pre-trained network's, quantised
    and base64-encoded; here a fixed pattern), so 'trained from scratch' would start trained."""

    def __init__(self, num_classes: int = 10) -> None:
        super().__init__(num_classes)
        with torch.no_grad():
            for i, t in enumerate([*self.parameters(), *self.buffers()]):
                t.fill_(i + 3)


def test_training_seeds_start_from_initial_values_drawn_here() -> None:
    """Whatever initial values the sandbox sends for a seed, the network trained starts from
    nasflow's own: the same for a hostile and an honest model of one architecture."""
    from nas.sandbox.verify import _graph_verdict, _seed_net

    def seed_net(net: nn.Module) -> GraphNet:
        graph = export_graph(net, torch.randn(2, 3, 16, 16))
        tensors = {k: v.detach().clone() for k, v in [*net.named_parameters(), *net.named_buffers()]}
        data = pack(graph, {"init": tensors, "seed7": tensors, "const": graph.pop("constants")})
        verdict = _graph_verdict(data, 10, (2, 3, 16, 16), Limits(), False, [7])
        assert verdict.ok, verdict.error
        return _seed_net(unpack(data, 1 << 30, ("init", "const", "seed7")), 7)

    hostile, honest = seed_net(Smuggled()).state_dict(), seed_net(Small()).state_dict()
    assert hostile.keys() == honest.keys() and all(torch.equal(hostile[k], honest[k]) for k in hostile)
    assert torch.equal(hostile["bn.weight"], torch.ones(8)) and torch.equal(hostile["bn.running_var"], torch.ones(8))
    assert not hostile["bn.bias"].any() and not hostile["bn.running_mean"].any()
    assert int(hostile["bn.num_batches_tracked"]) == 0
    for name, fan_in in [("conv.weight", 27), ("fc.weight", 8), ("fc.bias", 8)]:  # PyTorch's default
        assert hostile[name].abs().max() <= fan_in ** -0.5 and hostile[name].std() > 0.2 * fan_in ** -0.5


def test_an_artifact_exactly_at_the_size_bound_unpacks() -> None:
    """The bound is on the entries' unpacked bytes, inclusive: one byte under it is refused."""
    data = artifact(Small())
    total = sum(info.file_size for info in zipfile.ZipFile(io.BytesIO(data)).infolist())
    unpack(data, total)
    with pytest.raises(GraphError, match=rf"artifact is too large \({total:,} bytes, over {total - 1:,}\)"):
        unpack(data, total - 1)


class SamePadding(nn.Module):
    def __init__(self, padding: str) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=padding)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.conv(x).mean((2, 3))


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_a_convolution_padded_by_name_is_checked_and_rebuilt(padding: str) -> None:
    """`nn.Conv2d(padding="same")` exports as aten.conv2d.padding, whose string was refused as an
    operator that "takes a string": a common honest layer failed the check."""
    torch.manual_seed(0)
    net, x = SamePadding(padding), torch.randn(2, 3, 16, 16)
    g = rebuilt(net)
    net.eval(), g.eval()
    assert torch.equal(net(x), g(x))
    # counted as the same convolution padded by number (fvcore has no handle for _convolution_mode)
    spelled = nn.Conv2d(3, 4, 3, padding=1 if padding == "same" else 0)
    assert count_flops(g, (2, 3, 16, 16)) == count_flops(net, (2, 3, 16, 16)) == count_flops(
        spelled, (2, 3, 16, 16)) > 0
