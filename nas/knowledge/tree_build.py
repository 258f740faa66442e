"""`nas knowledge tree --build`: rebuild the attribute tree the FairNAD way.
The two upper levels (granularity, main category) are fixed; the LLM reads the
source of each reference model (from timm) and names the sub-attributes it
sees under each main category, for each target. Only the parsed module text is
sent (class bodies without docstrings), never executed."""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from typing import Any

from nas.knowledge.tree import AttributeTree
from nas.llm.parse import ParseError, extract_json
from nas.llm.prompts import load_prompt

# Reference model -> (timm module, classes whose code shows its design).
REFERENCE_MODELS: dict[str, tuple[str, tuple[str, ...]]] = {
    "ResNet": ("timm.models.resnet", ("BasicBlock", "Bottleneck")),
    "ResNeXt": ("timm.models.resnet", ("Bottleneck",)),
    "MobileNetV2": ("timm.models._efficientnet_blocks", ("InvertedResidual", "DepthwiseSeparableConv")),
    "MobileNetV3": ("timm.models._efficientnet_blocks", ("InvertedResidual", "SqueezeExcite")),
    "EfficientNet": ("timm.models._efficientnet_blocks", ("InvertedResidual", "SqueezeExcite", "EdgeResidual")),
    "Inception": ("timm.models.inception_v3", ("InceptionA", "InceptionB", "InceptionC")),
    "ConvNeXt": ("timm.models.convnext", ("ConvNeXtBlock", "ConvNeXtStage")),
    "ViT": ("timm.models.vision_transformer", ("Attention", "Block")),
    "Swin": ("timm.models.swin_transformer", ("WindowAttention", "SwinTransformerBlock", "PatchMerging")),
    "EfficientViT": ("timm.models.efficientvit_mit", ("LiteMLA", "EfficientVitBlock", "MBConv")),
    "MLP-Mixer": ("timm.models.mlp_mixer", ("MixerBlock",)),
    "EfficientFormer": ("timm.models.efficientformer", ("Attention", "Pooling", "MetaBlock2d")),
    "LeViT": ("timm.models.levit", ("Attention", "AttentionDownsample", "LevitMlp")),
    "MobileViT": ("timm.models.mobilevit", ("MobileVitBlock",)),
}


def abridged_source(module_name: str, classes: tuple[str, ...], max_chars: int = 3000) -> str:
    """The named classes' `__init__`/`forward` code without docstrings, blank lines or comments."""

    tree = ast.parse(inspect.getsource(importlib.import_module(module_name)))
    parts = []
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name in classes:
            node.body = [n for n in node.body if isinstance(n, ast.FunctionDef)
                         and n.name in ("__init__", "forward")] or node.body
            for fn in node.body:
                if isinstance(fn, ast.FunctionDef) and fn.body and isinstance(fn.body[0], ast.Expr) \
                        and isinstance(getattr(fn.body[0], "value", None), ast.Constant):
                    fn.body = fn.body[1:] or [ast.Pass()]
            node.decorator_list = []
            parts.append(ast.unparse(node))
    text = "\n\n".join(parts)
    text = re.sub(r"\n\s*\n", "\n", text)
    return text[:max_chars]


_SUB = re.compile(r"^[a-z][a-z0-9 ()/+.-]{2,39}$")


def usable_sub(sub: str, mains: set[str]) -> bool:
    """Drop what weak models echo: template placeholders, category names, fragments."""
    return bool(_SUB.match(sub)) and sub not in mains and sum(c.isalpha() for c in sub) >= 3 \
        and any(len(w) >= 3 for w in sub.split())


def _schema(mains: list[str], max_items: int) -> dict[str, Any]:
    return {"type": "object", "required": ["attributes"], "properties": {"attributes": {
        "type": "array", "maxItems": max_items, "items": {
            "type": "object", "required": ["main", "sub"],
            "properties": {"main": {"type": "string", "enum": mains},
                           "sub": {"type": "string", "minLength": 3, "maxLength": 40}}}}}}


def build_tree(client, *, models: dict[str, tuple[str, tuple[str, ...]]] | None = None, max_items: int = 8,
               progress: bool = False) -> tuple[AttributeTree, dict[str, Any]]:
    """Fixed upper levels from the built-in tree; sub-categories from the LLM's reading of each model."""
    from rich.progress import Progress  # lazy: loads rich (start-up time)


    base = AttributeTree.builtin()
    prompt = load_prompt("tree_analyst")
    models = models or REFERENCE_MODELS
    found: dict[str, list[str]] = {m: [] for m in base.mains()}
    report: dict[str, Any] = {"models": 0, "calls": 0, "failed": 0, "errors": [], "found": {}}

    def parse(reply) -> list[tuple[str, str]]:
        data = extract_json(reply.text)
        items = data.get("attributes") if isinstance(data, dict) else None
        if not isinstance(items, list):
            raise ParseError("reply has no 'attributes' list")
        return [(str(i.get("main", "")), " ".join(str(i.get("sub", "")).replace("*", " ").lower().split()))
                for i in items if isinstance(i, dict)]

    jobs = [(name, target) for name in models for target in base.targets]
    all_mains = {m.lower() for m in base.mains()}
    with Progress(transient=True, disable=not progress) as bar:
        task = bar.add_task("analysing reference models", total=len(jobs))
        for name, target in jobs:
            module, classes = models[name]
            mains = base.mains(target=target)
            listing = "\n".join(f"- {base.granularity_display(base.main_tag(m).granularity)} / {m}" for m in mains)
            values = {"model": name, "target": target, "mains": listing, "max_items": max_items,
                      "source": abridged_source(module, classes)}
            answer = client.ask("analyst", prompt, values, parse, schema=_schema(mains, max_items), tries=2)
            report["calls"] += len(answer.replies)
            if not answer.ok:
                report["failed"] += 1
                report["errors"].append(f"{name}/{target}: {answer.errors[-1] if answer.errors else 'no reply'}")
            for main, sub in answer.value or []:
                if main in mains and usable_sub(sub, all_mains) and sub not in found[main]:
                    found[main].append(sub)
                    report["found"].setdefault(name, []).append(f"{main}: {sub}")
            bar.advance(task)
    report["models"] = len(models)
    data = base.to_dict()
    for target_rows in data["targets"].values():
        for row in target_rows:
            row["subs"] = [{"name": s, "description": ""} for s in found[row["main"]]]
    data["source"] = f"rebuilt by {client.config.model} from {len(models)} timm reference models"
    return AttributeTree.from_dict(data), report
