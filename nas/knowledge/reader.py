"""The Reader: papers in, tagged design ideas out (FairNAD's two stages).

Stage 1 screens the abstract against the attribute tree; stage 2 extracts
ideas (at most 50 words each) from the method text; each idea is tagged with a
tree leaf; near-identical ideas are dropped by the store. A paper is recorded
by content hash once read (accepted or rejected), so a second ingest skips it;
a paper whose LLM calls failed is not recorded and is read again next time."""

from __future__ import annotations

import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from nas.errors import NasError
from nas.knowledge.idea import IDEA_MAX_WORDS, Idea
from nas.knowledge.papers import BadFile, ExperienceFile, IdeaList, Paper, read_path
from nas.knowledge.tagger import EmbeddingTagger, leaf_string
from nas.knowledge.tree import AttributeTree
from nas.llm.gbnf import gbnf_choice
from nas.llm.parse import ParseError, extract_list, extract_tagged
from nas.llm.prompts import load_prompt

ECHO_EVERY, ECHO_S = 10, 10.0   # without a TTY: a progress line every 10 items or 10 s
_SEC = r"^\s*(?:#+\s*|\d+(?:\.\d+)*\.?\s+|[IVX]+\.\s+)?"
_METHOD = re.compile(_SEC + r"(?:proposed\s+|our\s+)?(?:methods?|methodology|approach|architecture|model)\b[^\n]{0,60}$",
                     re.IGNORECASE | re.MULTILINE)
_END = re.compile(_SEC + r"(?:experiments?|evaluation|results|conclusions?|related work)\b[^\n]{0,60}$",
                  re.IGNORECASE | re.MULTILINE)


def method_text(paper: Paper, max_chars: int) -> str:
    """The method section if headings show one, else the start of the body, else the abstract."""
    body = paper.body
    m = _METHOD.search(body)
    if m:
        end = _END.search(body, m.end())
        section = body[m.start(): end.start() if end else None]
    else:
        section = body
    section = " ".join(section.split())
    return (section or paper.abstract)[:max_chars]


def clean_idea(text: str) -> str | None:
    """FairNAD's output rules: no '*' or ':', at most 50 words; fragments are dropped."""
    text = re.sub(r"[*:#`]", " ", text)
    words = text.split()
    if len(words) < 4:
        return None
    return " ".join(words[:IDEA_MAX_WORDS]).rstrip(",;")


@dataclass
class IngestReport:
    papers: int = 0
    cached: int = 0            # read by an earlier ingest (same content hash)
    accepted: int = 0
    rejected: int = 0          # stage 1 said the paper holds no block-design idea
    failed: int = 0            # LLM calls failed; the paper is read again next time
    idea_lists: int = 0
    experiences: int = 0       # tips/suggestions imported from NADER experience files
    ideas: int = 0
    added: int = 0
    duplicates: int = 0
    tagged: dict[str, int] = field(default_factory=dict)   # given / llm / embed
    bad_files: list[dict[str, str]] = field(default_factory=list)
    failures: list[dict[str, str]] = field(default_factory=list)
    seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def merged(cls, reports: list[IngestReport], seconds: float) -> IngestReport:
        """Reports of files read in parallel, as one (`seconds` is the wall time)."""
        out = cls(seconds=seconds)
        for r in reports:
            for key, value in asdict(r).items():
                if key == "seconds":
                    continue
                if key == "tagged":
                    for name, n in value.items():
                        out.tagged[name] = out.tagged.get(name, 0) + n
                else:
                    setattr(out, key, getattr(out, key) + value)
        return out


class Reader:
    def __init__(self, store, tree: AttributeTree, tagger, client=None, *, experiences=None, screen: str = "llm",
                 screen_threshold: float = 0.45, max_method_chars: int = 4000, max_ideas: int = 5,
                 dedup_threshold: float = 0.95) -> None:
        self.store = store
        self.experiences = experiences
        self.tree = tree
        self.tagger = tagger
        self.client = client
        self.screen = screen  # llm | embed | off
        self.screen_threshold = screen_threshold
        self._embed_tagger = tagger if isinstance(tagger, EmbeddingTagger) else getattr(tagger, "fallback", None)
        if screen not in ("llm", "embed", "off") or (screen == "embed" and self._embed_tagger is None):
            raise ValueError(f"screen must be llm, embed (with an embedding tagger) or off, got {screen!r}")
        self.max_method_chars = max_method_chars
        self.max_ideas = max_ideas
        self.dedup_threshold = dedup_threshold
        self.filter_prompt = load_prompt("reader_filter")
        self.extract_prompt = load_prompt("reader_extract")
        self._trees = {"performance_tree": tree.render("performance"),
                       "efficiency_tree": tree.render("efficiency")}
        self.filter_grammar = ('root ::= "##response##" answer\nanswer ::= "no" | '
                               + gbnf_choice(leaf_string(t) for t in tree.tags()) + "\n")
        self.extract_grammar = (f"root ::= item{{1,{max_ideas}}}\n"
                                'item ::= "- " [^\\n*:]{12,320} "\\n"\n')

    def ingest(self, paths: Iterable[Path], *, progress: bool = False,
               echo: Callable[[str], None] | None = None) -> IngestReport:
        """`progress`: a bar per paper with the LLM call under way (a TTY); `echo`: otherwise a short
        line every `ECHO_EVERY` items or `ECHO_S` seconds (minutes of reading are never silent)."""
        report = IngestReport()
        start = time.perf_counter()
        items = [item for path in paths for item in read_path(Path(path))]
        if echo is not None:
            echo(f"ingest: {len(items)} items to read (a paper is one or two LLM calls; a line every "
                 f"{ECHO_EVERY} items or {ECHO_S:.0f} s says how long is left)")
        from rich.progress import Progress, TextColumn  # lazy: loads rich (start-up time)

        with Progress(*Progress.get_default_columns(), TextColumn("{task.fields[llm]}"), transient=True,
                      disable=not progress) as bar:
            task = bar.add_task("reading", total=len(items), llm="")
            if progress and self.client is not None:
                self.client.on_status = lambda text: bar.update(task, llm=text)
            shown = start
            for done, item in enumerate(items, 1):
                if isinstance(item, BadFile):
                    report.bad_files.append({"path": item.path, "reason": item.reason})
                elif isinstance(item, IdeaList):
                    self._ingest_list(item, report, bar)
                elif isinstance(item, ExperienceFile):
                    self._ingest_experiences(item, report)
                else:
                    bar.update(task, description=f"reading {item.title[:40]}")
                    self._ingest_paper(item, report)
                bar.advance(task)
                now = time.perf_counter()
                if echo is not None and (done % ECHO_EVERY == 0 or now - shown >= ECHO_S or done == len(items)):
                    shown = now
                    left = (now - start) / done * (len(items) - done)  # the bar's TimeRemainingColumn, as a line
                    echo(f"ingest: {done}/{len(items)} items, {report.papers} papers read, "
                         f"{report.added} ideas added, {report.failed} failed, {now - start:.0f} s"
                         + (f", about {left:.0f} s left" if done < len(items) else ""))
            if self.client is not None:
                self.client.on_status = None
        report.seconds = time.perf_counter() - start
        return report

    # -- one paper ----------------------------------------------------------------------------------------

    def _ingest_paper(self, paper: Paper, report: IngestReport) -> None:
        report.papers += 1
        if self.store.has_paper(paper.hash):
            report.cached += 1
            return
        meta = {"year": paper.year, "venue": paper.venue, "source": paper.source, "line": paper.line}
        try:
            if paper.ideas:
                ideas = self._given_ideas(paper, report)
            else:
                if self._screen(paper) == "no":
                    report.rejected += 1
                    self.store.add_paper(paper.hash, paper.title, {**meta, "status": "rejected"},
                                         f"{paper.title}. {paper.abstract}")
                    return
                ideas = self._extract(paper)
                self._tag(ideas, report)
        except (ParseError, _Failed) as err:
            report.failed += 1
            where = f"{paper.source}:{paper.line}" if paper.line else paper.source
            report.failures.append({"paper": paper.title[:120], "where": where, "error": str(err)})
            return
        report.accepted += 1
        report.ideas += len(ideas)
        added = self.store.add_ideas(ideas, dedup_threshold=self.dedup_threshold)
        report.added += added.added
        report.duplicates += added.duplicates
        self.store.add_paper(paper.hash, paper.title, {**meta, "status": "accepted", "ideas": len(ideas)},
                             f"{paper.title}. {paper.abstract}")

    def _given_ideas(self, paper: Paper, report: IngestReport) -> list[Idea]:
        ideas, untagged = [], []
        for i, d in enumerate(paper.ideas):
            text = clean_idea(d["text"])
            if text is None:
                continue
            idea = Idea(text, source=paper.source, paper_id=paper.hash, paper_title=paper.title)
            if d.get("main"):
                try:
                    idea.tag = self.tree.check({k: d.get(k, "") for k in ("target", "granularity", "main", "sub")})
                except ValueError as err:
                    raise _Failed(f"idea {i}: {err}") from None
                report.tagged["given"] = report.tagged.get("given", 0) + 1
            else:
                untagged.append(idea)
            ideas.append(idea)
        self._tag(untagged, report)
        return ideas

    def _screen(self, paper: Paper) -> str:
        if self.screen == "off":
            return "yes"
        if self.screen == "embed" and self._embed_tagger is not None:  # __init__ requires the tagger
            score = self._embed_tagger.relevance(f"{paper.title}. {paper.abstract}")
            return "yes" if score >= self.screen_threshold else "no"
        answer = self._ask("reader_filter", self.filter_prompt,
                           {**self._trees, "title": paper.title, "abstract": paper.abstract[:3000]},
                           self._parse_screen, self.filter_grammar)
        return answer

    def _parse_screen(self, reply) -> str:
        verdict = extract_tagged(reply.text, "response").splitlines()[0].strip() if reply.text else ""
        if verdict.lower().startswith("no"):
            return "no"
        self.tree.check(verdict)  # raises ValueError naming the bad part
        return verdict

    def _extract(self, paper: Paper) -> list[Idea]:
        values = {**self._trees, "title": paper.title, "max_ideas": self.max_ideas,
                  "method": method_text(paper, self.max_method_chars)}

        def parse(reply) -> list[str]:
            texts = [t for item in extract_list(reply.text) if (t := clean_idea(item))]
            if not texts:
                raise ParseError("no idea of 4+ words in the reply")
            return texts[: self.max_ideas]

        texts = self._ask("reader_extract", self.extract_prompt, values, parse, self.extract_grammar)
        return [Idea(t, source=paper.source, paper_id=paper.hash, paper_title=paper.title) for t in texts]

    def _ask(self, what: str, prompt, values, parse, grammar):
        if self.client is None:
            raise _Failed(f"{what}: no LLM configured (papers without ready-made ideas need one)")
        answer = self.client.ask("reader", prompt, values, parse, grammar=grammar, tries=2)
        if not answer.ok:
            raise _Failed(f"{what}: {answer.errors[-1] if answer.errors else 'no reply'}")
        return answer.value

    def _tag(self, ideas: list[Idea], report: IngestReport) -> None:
        if not ideas:
            return
        for idea, tag in zip(ideas, self.tagger.tag([i.text for i in ideas])):
            idea.tag = tag
        report.tagged[self.tagger.name] = report.tagged.get(self.tagger.name, 0) + len(ideas)

    def _ingest_experiences(self, item: ExperienceFile, report: IngestReport) -> None:
        # lazy: loads qdrant_client, threadpoolctl (start-up time)
        from nas.knowledge.store import import_nader_experiences

        if self.experiences is None:
            report.bad_files.append({"path": item.path, "reason": "an experience file, but no experience store given"})
            return
        try:
            found = import_nader_experiences(item.path)
        except NasError as err:
            report.bad_files.append({"path": item.path, "reason": str(err).removeprefix(f"{item.path}: ")})
            return
        self.experiences.add_many(found)
        report.experiences += len(found)

    # -- ready-made idea lists ----------------------------------------------------------------------------

    def _ingest_list(self, item: IdeaList, report: IngestReport, bar) -> None:
        report.idea_lists += 1
        ideas = [Idea(text, source=item.source, paper_id=str(d.get("paper_id", "")),
                      extra={"id": d.get("id")} if d.get("id") is not None else {})
                 for d in item.ideas if (text := clean_idea(d["text"]))]
        task = bar.add_task(f"tagging {Path(item.source).name}", total=len(ideas), llm="")  # the bar shows `llm`
        chunk = 256
        for lo in range(0, len(ideas), chunk):
            part = ideas[lo: lo + chunk]
            self._tag(part, report)
            added = self.store.add_ideas(part, dedup_threshold=self.dedup_threshold)
            report.added += added.added
            report.duplicates += added.duplicates
            bar.advance(task, len(part))
        report.ideas += len(ideas)
        bar.remove_task(task)


class _Failed(Exception):
    """An LLM stage gave no usable answer for this paper."""
