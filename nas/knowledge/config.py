"""Knowledge settings (`conf/knowledge/*.yaml`) and the objects they build."""

from __future__ import annotations

from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from nas.core.registry import check_keys
from nas.errors import ConfigError
from nas.knowledge.papers import builtin_ideas
from nas.knowledge.tree import AttributeTree
from nas.status import status

TAGGERS = ("embed", "llm")
SCREENS = ("auto", "llm", "embed", "off")
EMBEDDED_MODEL = "smollm2-135m-instruct"


@dataclass
class KnowledgeConfig:
    path: str | None = None
    url: str | None = None
    tree: str = "builtin"
    tagger: str = "embed"
    screen: str = "auto"
    screen_threshold: float = 0.45
    max_ideas: int = 5
    max_method_chars: int = 4000
    dedup_threshold: float = 0.95
    seed_builtin: bool = True   # an empty idea store gets the built-in corpus's ideas when a search opens it

    @classmethod
    def from_dict(cls, data: dict[str, Any] | None) -> KnowledgeConfig:
        data = dict(data or {})
        data.pop("name", None)
        check_keys("knowledge", data, [f.name for f in fields(cls)])
        cfg = cls(**data)
        if cfg.tagger not in TAGGERS:
            raise ConfigError(f"knowledge.tagger must be one of {', '.join(TAGGERS)}, got {cfg.tagger!r}")
        if cfg.screen not in SCREENS:
            raise ConfigError(f"knowledge.screen must be one of {', '.join(SCREENS)}, got {cfg.screen!r}")
        if not 0.0 < float(cfg.dedup_threshold) <= 1.0:
            raise ConfigError(f"knowledge.dedup_threshold must be in (0, 1], got {cfg.dedup_threshold}")
        if int(cfg.max_ideas) <= 0 or int(cfg.max_method_chars) <= 0:
            raise ConfigError("knowledge.max_ideas and knowledge.max_method_chars must be > 0")
        return cfg

    def screen_mode(self, reader_model: str) -> str:
        """`auto`: the LLM screens, except the embedded 135M model, which answers
        "no" to every abstract (measured); abstracts are then screened by their
        similarity to the tree's leaves."""
        if self.screen != "auto":
            return self.screen
        return "embed" if reader_model == EMBEDDED_MODEL else "llm"

    def load_tree(self):
        if self.tree == "builtin":
            return AttributeTree.builtin()
        path = Path(self.tree).expanduser()
        if not path.is_file():
            raise ConfigError(f"knowledge.tree: {path} does not exist (use 'builtin' or a tree JSON file)")
        return AttributeTree.load(path)

    def open_store(self, embedder=None):
        # lazy: loads numpy, qdrant_client, threadpoolctl (start-up time)
        from nas.knowledge.store import KnowledgeStore

        return KnowledgeStore(**self._where(), embedder=embedder)

    def open_ideas(self, embedder=None, *, progress: bool = True):
        """The idea store for a design search; an empty one is seeded with the
        built-in corpus's tagged ideas (`seed_builtin`), so a fresh machine designs
        from papers' ideas without an ingest first. `progress`: the search's, so
        progress=false seeds silently."""

        store = self.open_store(embedder)
        if self.seed_builtin and store.count() == 0:

            ideas = builtin_ideas()
            # once per store, before a NADER or FairNAD search's first trial: ~10 s on 2 busy cores
            with status(f"seeding the idea store with {len(ideas)} built-in ideas (the embedding model loads first)",
                        show=progress):
                store.add_ideas(ideas, dedup_threshold=self.dedup_threshold)
        return store

    def open_experiences(self, embedder=None):
        # lazy: loads numpy, qdrant_client, threadpoolctl (start-up time)
        from nas.knowledge.store import ExperienceStore

        return ExperienceStore(**self._where(), embedder=embedder)

    def _where(self) -> dict[str, Any]:
        return {"path": Path(self.path).expanduser() if self.path else None, "url": self.url}

    def build_tagger(self, tree, embedder, client=None):
        from nas.knowledge.tagger import EmbeddingTagger, LLMTagger  # lazy: loads numpy (start-up time)

        fallback = EmbeddingTagger(tree, embedder)
        if self.tagger == "llm":
            if client is None:
                raise ConfigError("knowledge.tagger=llm needs an LLM (llm=local|openai|replay)")
            return LLMTagger(tree, client, fallback)
        return fallback
