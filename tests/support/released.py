"""Released supernet files as their projects write them, for the tests of `supernets.released`.

OFA's come from the `ofa` package's own `OFAMobileNetV3` built with its model zoo's settings.
SPOS's come from `OfficialSPOS`, the authors' supernet (megvii-model/SinglePathOneShot,
src/Supernet: network.py's ShuffleNetV2_OneShot, blocks.py's Shufflenet and Shuffle_Xception)
restated here from that code: the same module names, layer order and forward (its channel shuffle
by reshape and permute, its 7x7 average pool), independent of our `ChoiceUnit`. Every BatchNorm's
statistics (and affine weights, where there are any) are randomised, so a tensor put in the wrong
place changes the outputs.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

ZOO = {"dropout_rate": 0, "ks_list": [3, 5, 7], "expand_ratio_list": [3, 4, 6], "depth_list": [2, 3, 4]}  # ofa.model_zoo.ofa_net's


def randomise_batchnorm(net: nn.Module, seed: int) -> nn.Module:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, nn.modules.batchnorm._BatchNorm):
                n = m.num_features
                m.running_mean.copy_(torch.randn(n, generator=g) * 0.2)
                m.running_var.copy_(torch.rand(n, generator=g) + 0.5)
                m.num_batches_tracked.fill_(int(torch.randint(1, 1000, (1,), generator=g)))
                if m.affine:
                    m.weight.copy_(torch.rand(n, generator=g) + 0.5)
                    m.bias.copy_(torch.randn(n, generator=g) * 0.1)
    return net


def ofa_zoo_net(width_mult: float, seed: int = 0) -> nn.Module:
    """The network `ofa.model_zoo.ofa_net("ofa_mbv3_d234_e346_k357_w<width_mult>")` builds, weights random."""
    from ofa.imagenet_classification.elastic_nn.networks import OFAMobileNetV3

    torch.manual_seed(seed)
    return randomise_batchnorm(OFAMobileNetV3(width_mult=width_mult, **ZOO), seed).eval()


def write_ofa_zoo(path: Path, width_mult: float, seed: int = 0) -> Path:
    """A model-zoo file: `torch.save({"state_dict": net.state_dict()})`."""
    torch.save({"state_dict": ofa_zoo_net(width_mult, seed).state_dict()}, path)
    return path


# --- SPOS, restated from the authors' supernet -------------------------------------------------

def _pw(cin: int, cout: int, affine: bool) -> list[nn.Module]:
    return [nn.Conv2d(cin, cout, 1, 1, 0, bias=False), nn.BatchNorm2d(cout, affine=affine), nn.ReLU(inplace=True)]


def _dw(c: int, k: int, stride: int, affine: bool) -> list[nn.Module]:
    return [nn.Conv2d(c, c, k, stride, k // 2, groups=c, bias=False), nn.BatchNorm2d(c, affine=affine)]


class OfficialUnit(nn.Module):
    """Shufflenet (ksize 3/5/7) or Shuffle_Xception: `branch_main`, and in a stride-2 block
    `branch_proj`; a stride-1 block splits its input by the official channel shuffle."""

    def __init__(self, inp: int, oup: int, mid: int, ksize: int, stride: int, xception: bool, affine: bool) -> None:
        super().__init__()
        out, a = oup - inp, affine
        if xception:
            main = [*_dw(inp, 3, stride, a), *_pw(inp, mid, a), *_dw(mid, 3, 1, a), *_pw(mid, mid, a),
                    *_dw(mid, 3, 1, a), *_pw(mid, out, a)]
        else:
            main = [*_pw(inp, mid, a), *_dw(mid, ksize, stride, a), *_pw(mid, out, a)]
        self.branch_main = nn.Sequential(*main)
        self.stride = stride
        if stride == 2:
            self.branch_proj = nn.Sequential(*_dw(inp, 3 if xception else ksize, 2, a), *_pw(inp, inp, a))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stride == 2:
            return torch.cat((self.branch_proj(x), self.branch_main(x)), 1)
        b, c, h, w = x.shape
        halves = x.reshape(b * c // 2, 2, h * w).permute(1, 0, 2).reshape(2, -1, c // 2, h, w)
        return torch.cat((halves[0], self.branch_main(halves[1])), 1)


class OfficialSPOS(nn.Module):
    """ShuffleNetV2_OneShot of src/Supernet: `first_conv`, `features[block][choice]`, `conv_last`,
    `classifier`; `forward(x, architecture)` runs one path. `channels` is its stage_out_channels
    from the stem on (the ImageNet supernet's by default). Its BatchNorms are affine=False; `affine`
    gives a variant with affine ones (a retrained copy, not what the authors released)."""

    def __init__(self, repeats: tuple[int, ...] = (4, 4, 8, 4),
                 channels: tuple[int, ...] = (16, 64, 160, 320, 640, 1024), n_class: int = 1000,
                 affine: bool = False) -> None:
        super().__init__()
        width = channels[0]
        self.first_conv = nn.Sequential(nn.Conv2d(3, width, 3, 2, 1, bias=False),
                                        nn.BatchNorm2d(width, affine=affine), nn.ReLU(inplace=True))
        self.features = nn.ModuleList()
        for stage, n in enumerate(repeats):
            out = channels[stage + 1]
            for i in range(n):
                inp, stride = (width, 2) if i == 0 else (width // 2, 1)
                self.features.append(nn.ModuleList(
                    [OfficialUnit(inp, out, out // 2, k, stride, False, affine) for k in (3, 5, 7)]
                    + [OfficialUnit(inp, out, out // 2, 3, stride, True, affine)]))
                width = out
        self.conv_last = nn.Sequential(nn.Conv2d(width, channels[-1], 1, 1, 0, bias=False),
                                       nn.BatchNorm2d(channels[-1], affine=affine), nn.ReLU(inplace=True))
        self.globalpool = nn.AvgPool2d(7)
        self.dropout = nn.Dropout(0.1)
        self.classifier = nn.Sequential(nn.Linear(channels[-1], n_class, bias=False))
        self.last = channels[-1]

    def forward(self, x: torch.Tensor, architecture: list[int]) -> torch.Tensor:
        x = self.first_conv(x)
        for units, choice in zip(self.features, architecture, strict=True):
            x = units[choice](x)
        x = self.globalpool(self.conv_last(x))
        return self.classifier(self.dropout(x).contiguous().view(-1, self.last))


def official_spos(seed: int = 0, **sizes: object) -> OfficialSPOS:
    torch.manual_seed(seed)
    return randomise_batchnorm(OfficialSPOS(**sizes), seed).eval()  # type: ignore[arg-type]


def write_spos(path: Path, net: OfficialSPOS) -> Path:
    """As their train.py saves it: the model wrapped in nn.DataParallel, {'state_dict': ...}."""
    torch.save({"state_dict": {f"module.{k}": v for k, v in net.state_dict().items()}}, path)
    return path


# --- AutoFormer, in the release's names (microsoft/Cream AutoFormer/) ------------------------------

# SUPERNET: (embed_dim, num_heads, depth, mlp_ratio) the released supernets were built at.
SUPERNET = {"autoformer_t": (256, 4, 14, 4.0), "autoformer_s": (448, 7, 14, 4.0), "autoformer_b": (640, 10, 16, 4.0)}
MAX_DISTANCE = 14  # --max_relative_position's default


def official_shapes(embed: int, heads: int, depth: int, mlp: float, *, classes: int = 1000, image: int = 224,
                    patch: int = 16, relative: bool = True) -> dict[str, tuple[int, ...]]:
    """`Vision_TransformerSuper(...).state_dict()`'s names and shapes, in its order: the model's own
    parameters (pos_embed, cls_token), then its modules in the order __init__ assigns them."""
    hidden, tokens = int(mlp * embed), (image // patch) ** 2 + 1
    shapes: dict[str, tuple[int, ...]] = {"pos_embed": (1, tokens, embed), "cls_token": (1, 1, embed),
                                          "patch_embed_super.proj.weight": (embed, 3, patch, patch),
                                          "patch_embed_super.proj.bias": (embed,)}
    for i in range(depth):
        layer = f"blocks.{i}."
        shapes |= {layer + "attn.qkv.weight": (3 * embed, embed), layer + "attn.qkv.bias": (3 * embed,)}
        if relative:
            for table in ("k", "v"):
                for axis in ("v", "h"):
                    shapes[f"{layer}attn.rel_pos_embed_{table}.embeddings_table_{axis}"] = (
                        2 * MAX_DISTANCE + 2, embed // heads)
        shapes |= {layer + "attn.proj.weight": (embed, embed), layer + "attn.proj.bias": (embed,)}
        for norm in ("attn_layer_norm", "ffn_layer_norm"):
            shapes |= {f"{layer}{norm}.weight": (embed,), f"{layer}{norm}.bias": (embed,)}
        shapes |= {layer + "fc1.weight": (hidden, embed), layer + "fc1.bias": (hidden,),
                   layer + "fc2.weight": (embed, hidden), layer + "fc2.bias": (embed,)}
    return shapes | {"norm.weight": (embed,), "norm.bias": (embed,),
                     "head.weight": (classes, embed), "head.bias": (classes,)}


def official_tensors(scale: str, seed: int = 0, classes: int = 1000) -> dict[str, torch.Tensor]:
    """Random values of a scale's shapes, big enough that every tensor moves the output: norms
    around 1, weights and tables wide enough that attention is far from uniform."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for name, shape in official_shapes(*SUPERNET[scale], classes=classes).items():
        t = torch.randn(shape, generator=gen)
        if "layer_norm.weight" in name or name == "norm.weight":
            t = 1 + 0.2 * t
        elif "embeddings_table" in name:
            t = 0.5 * t
        elif name.endswith(".weight") and len(shape) == 2:
            t = t * (1.5 / shape[1] ** 0.5)
        else:
            t = 0.1 * t
        tensors[name] = t
    return tensors


def save_release(path: Path, tensors: dict[str, torch.Tensor]) -> Path:
    """As `supernet_train.py` saves its checkpoint: the model with the training state and settings."""
    opt = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=5e-4)
    args = argparse.Namespace(gp=True, change_qkv=True, relative_position=True, max_relative_position=MAX_DISTANCE,
                              cfg="./experiments/supernet/supernet-T.yaml", mode="super", input_size=224,
                              patch_size=16, lr=5e-4, opt_betas=None, data_set="IMNET", epochs=500)
    torch.save({"model": tensors, "optimizer": opt.state_dict(), "lr_scheduler": {"base_values": [5e-4], "t_initial": 500},
                "epoch": 499, "scaler": {"scale": 65536.0, "_growth_tracker": 0}, "args": args}, path)
    return path
