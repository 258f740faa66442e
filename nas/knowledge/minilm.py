"""all-MiniLM-L6-v2 in plain numpy: the sentence-transformers vectors without torch.

A `nas knowledge search` used to spend most of its 10-25 s importing torch,
transformers and sentence-transformers and building the model, to embed one
query. This is the same model read from the same bundled folder: the
folder's tokenizer.json (through `tokenizers`, truncated at the folder's
`max_seq_length` as sentence-transformers does), the weights from
model.safetensors, the 6-layer BERT forward in float32 (GELU with an erf good to 5e-7), mean
pooling over the attention mask and L2 normalisation. Its vectors match
sentence-transformers' to about 1e-6 (tests/test_knowledge_minilm.py); loading
takes a fraction of a second."""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import numpy as np

from nas.errors import MissingDependencyError
from nas.lazy import LazyImport

# all three come with sentence-transformers' dependencies (threadpoolctl with scikit-learn's, as the
# store's); a missing one is refused in one line when the encoder is built
safetensors_numpy = LazyImport("safetensors.numpy")
threadpoolctl = LazyImport("threadpoolctl")
tokenizers = LazyImport("tokenizers")

WEIGHTS = "model.safetensors"
TOKENIZER = "tokenizer.json"
# Below this many tokens a batch runs on one BLAS thread: a query gains nothing from more, and on
# a loaded machine OpenBLAS's waiting threads made a 4 x 256-token batch 3-15x slower (2 busy cores).
ONE_THREAD_TOKENS = 4096


@functools.cache
def _blas():
    return threadpoolctl.ThreadpoolController()


def _read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}


def unsupported(path: Path) -> str | None:
    """Why the folder is not a model this encoder runs (None: it is): a sentence-transformers
    BERT with mean pooling and normalisation, safetensors weights and a fast tokenizer."""
    config = _read_json(path / "config.json")
    if config.get("model_type") != "bert" or config.get("hidden_act", "gelu") != "gelu":
        return "not a BERT model with GELU activations"
    if config.get("position_embedding_type", "absolute") != "absolute":
        return "not absolute position embeddings"
    types = [m.get("type", "") for m in json.loads((path / "modules.json").read_text(encoding="utf-8"))] \
        if (path / "modules.json").exists() else []
    if [t.rsplit(".", 1)[-1] for t in types] != ["Transformer", "Pooling", "Normalize"]:
        return f"modules {types} are not Transformer, Pooling, Normalize"
    pooling = _read_json(path / "1_Pooling" / "config.json")
    modes = {k for k, v in pooling.items() if k.startswith("pooling_mode") and v}
    if modes != {"pooling_mode_mean_tokens"}:
        return f"pooling {sorted(modes)} is not mean pooling"
    for name in (WEIGHTS, TOKENIZER, "sentence_bert_config.json"):
        if not (path / name).exists():
            return f"no {name}"
    return None


# erf for float32 as a rational function on [-4, 4] (Eigen's and XLA's; erf(4) = 1 - 2e-8): within
# 5e-7 of the exact erf, and no scipy import (~0.3 s of a search's start-up on 2 busy cores)
_ERF_P = np.array([-2.72614225801306e-10, 2.77068142495902e-08, -2.10102402082508e-06, -5.69250639462346e-05,
                   -7.34990630326855e-04, -2.95459980854025e-03, -1.60960333262415e-02], dtype=np.float32)
_ERF_Q = np.array([-1.45660718464996e-05, -2.13374055278905e-04, -1.68282697438203e-03, -7.37332916720468e-03,
                   -1.42647390514189e-02], dtype=np.float32)


def erf(x: np.ndarray) -> np.ndarray:
    x = np.clip(x, np.float32(-4.0), np.float32(4.0))
    x2 = x * x
    p = np.full_like(x, _ERF_P[0])
    for c in _ERF_P[1:]:
        p *= x2
        p += c
    q = np.full_like(x, _ERF_Q[0])
    for c in _ERF_Q[1:]:
        q *= x2
        q += c
    return x * p / q


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's exact GELU, x * Phi(x), with the erf above."""
    return np.float32(0.5) * x * (np.float32(1.0) + erf(x * np.float32(1 / np.sqrt(2))))


def _layer_norm(x: np.ndarray, gamma: np.ndarray, beta: np.ndarray, eps: float) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    centred = x - mean
    var = np.mean(centred * centred, axis=-1, keepdims=True)
    return centred / np.sqrt(var + eps) * gamma + beta


class MiniLM:
    """Texts -> L2-normalised float32 sentence vectors of a BERT sentence-transformers folder."""

    def __init__(self, path: str | Path) -> None:
        path = Path(path)
        why = unsupported(path)
        if why is not None:
            raise MissingDependencyError(f"{path}: not a model the numpy encoder runs ({why})")
        try:
            load_file, Tokenizer = safetensors_numpy.load_file, tokenizers.Tokenizer
        except ImportError as err:
            raise MissingDependencyError(f"the numpy encoder needs {err.name}: pip install {err.name}") from None
        self.path = path
        config = _read_json(path / "config.json")
        self.max_seq_length = int(_read_json(path / "sentence_bert_config.json").get("max_seq_length", 512))
        self.max_seq_length = min(self.max_seq_length, int(config["max_position_embeddings"]))
        self.do_lower_case = bool(_read_json(path / "sentence_bert_config.json").get("do_lower_case", False))
        self.eps = float(config.get("layer_norm_eps", 1e-12))
        self.heads = int(config["num_attention_heads"])
        self.dim = int(config["hidden_size"])
        self.tokenizer = Tokenizer.from_file(str(path / TOKENIZER))
        # The file's own settings (truncate at 128, pad to 128) are the exporter's, not what
        # sentence-transformers uses: it truncates at max_seq_length and pads to the batch's longest.
        self.tokenizer.enable_truncation(max_length=self.max_seq_length)
        self.tokenizer.no_padding()
        w = load_file(str(path / WEIGHTS))
        w = {k.removeprefix("bert."): v.astype(np.float32, copy=False) for k, v in w.items()}
        self.word = w["embeddings.word_embeddings.weight"]
        self.position = w["embeddings.position_embeddings.weight"]
        self.token_type = w["embeddings.token_type_embeddings.weight"]
        self.emb_norm = (w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"])
        self.layers = []
        for i in range(int(config["num_hidden_layers"])):
            p = f"encoder.layer.{i}."
            qkv_w = np.concatenate([w[p + f"attention.self.{n}.weight"] for n in ("query", "key", "value")])
            qkv_b = np.concatenate([w[p + f"attention.self.{n}.bias"] for n in ("query", "key", "value")])
            self.layers.append({
                "qkv": (np.ascontiguousarray(qkv_w.T), qkv_b),
                "out": (np.ascontiguousarray(w[p + "attention.output.dense.weight"].T),
                        w[p + "attention.output.dense.bias"]),
                "norm1": (w[p + "attention.output.LayerNorm.weight"], w[p + "attention.output.LayerNorm.bias"]),
                "up": (np.ascontiguousarray(w[p + "intermediate.dense.weight"].T), w[p + "intermediate.dense.bias"]),
                "down": (np.ascontiguousarray(w[p + "output.dense.weight"].T), w[p + "output.dense.bias"]),
                "norm2": (w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"]),
            })

    def encode(self, texts: list[str], batch_size: int = 64) -> np.ndarray:
        """One row per text, in order; texts of similar length are batched together."""
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        texts = [t.lower() if self.do_lower_case else t for t in texts]
        encodings = self.tokenizer.encode_batch(texts)
        order = np.argsort([-len(e.ids) for e in encodings], kind="stable")
        out = np.empty((len(texts), self.dim), dtype=np.float32)
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            longest = max(len(encodings[i].ids) for i in idx)
            ids = np.zeros((len(idx), longest), dtype=np.int64)
            types = np.zeros((len(idx), longest), dtype=np.int64)
            mask = np.zeros((len(idx), longest), dtype=bool)
            for row, i in enumerate(idx):
                e = encodings[i]
                ids[row, :len(e.ids)] = e.ids
                types[row, :len(e.ids)] = e.type_ids
                mask[row, :len(e.ids)] = True
            if ids.size <= ONE_THREAD_TOKENS:
                with _blas().limit(limits=1, user_api="blas"):
                    out[idx] = self._forward(ids, types, mask)
            else:
                out[idx] = self._forward(ids, types, mask)
        return out

    def _forward(self, ids: np.ndarray, types: np.ndarray, mask: np.ndarray) -> np.ndarray:
        batch, length = ids.shape
        heads, head_dim = self.heads, self.dim // self.heads
        # (B * T, hidden) throughout: numpy runs a 2-d matmul as one BLAS call, a 3-d one per row
        x = (self.word[ids] + self.position[:length] + self.token_type[types]).reshape(batch * length, self.dim)
        x = _layer_norm(x, *self.emb_norm, self.eps)
        # masked keys get no weight: the additive mask BERT uses, the float32 minimum
        bias = np.where(mask, 0.0, np.finfo(np.float32).min).astype(np.float32)[:, None, None, :]
        scale = np.float32(1.0 / np.sqrt(head_dim))
        for layer in self.layers:
            qkv = (x @ layer["qkv"][0] + layer["qkv"][1]).reshape(batch, length, 3, heads, head_dim)
            q = np.ascontiguousarray(qkv[:, :, 0].transpose(0, 2, 1, 3))  # (B, H, T, D)
            k = np.ascontiguousarray(qkv[:, :, 1].transpose(0, 2, 3, 1))  # (B, H, D, T)
            v = np.ascontiguousarray(qkv[:, :, 2].transpose(0, 2, 1, 3))
            scores = q @ k
            scores *= scale
            scores += bias  # (B, H, T, T)
            scores -= scores.max(-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(-1, keepdims=True)
            context = (scores @ v).transpose(0, 2, 1, 3).reshape(batch * length, self.dim)
            x = _layer_norm(context @ layer["out"][0] + layer["out"][1] + x, *layer["norm1"], self.eps)
            h = x @ layer["up"][0] + layer["up"][1]
            x = _layer_norm(gelu(h) @ layer["down"][0] + layer["down"][1] + x, *layer["norm2"], self.eps)
        weights = mask.reshape(batch, length, 1).astype(np.float32)
        pooled = (x.reshape(batch, length, self.dim) * weights).sum(1) / np.maximum(weights.sum(1), 1e-9)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        return (pooled / np.maximum(norms, 1e-12)).astype(np.float32)
