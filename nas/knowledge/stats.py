"""What the store holds, by attribute-tree category. FairNAD's point: raw
extraction is dominated by attention (~70 % of ideas); fair sampling over main
categories corrects for that, so the distribution is worth looking at."""

from __future__ import annotations

import io
import re
from collections import Counter
from pathlib import Path
from typing import Any

from nas.io import atomic_write_bytes

_ATTENTION = re.compile(r"\battention\b|\btransformer\b|self-attention", re.IGNORECASE)


def mentions_attention(text: str) -> bool:
    return bool(_ATTENTION.search(text))


def idea_stats(store, tree) -> dict[str, Any]:
    counts = store.category_counts()                      # {main: {sub: n}}, untagged under ""
    mains = {main: sum(subs.values()) for main, subs in counts.items()}
    total = sum(mains.values())
    sources: Counter[str] = Counter()
    for source, n in store.tag_counts()["source"].items():
        sources[source.rsplit("/", 1)[-1] or "-"] += n
    by_main = []
    for target in tree.targets:
        for main in tree.mains(target=target):
            n = mains.get(main, 0)
            by_main.append({"target": target, "granularity": tree.main_tag(main).granularity, "main": main,
                            "ideas": n, "share": n / total if total else 0.0,
                            "subs": {s: counts.get(main, {}).get(s, 0) for s in tree.subs(main)}})
    known = {row["main"] for row in by_main}
    other = sum(n for m, n in mains.items() if m and m not in known)
    granularity: Counter[str] = Counter()
    for row in by_main:
        granularity[row["granularity"]] += row["ideas"]
    mention = sum(mentions_attention(i.text) for i in store.ideas())
    return {
        "ideas": total, "papers": store.count_papers(), "untagged": mains.get("", 0), "other_tags": other,
        "by_main": by_main, "by_granularity": dict(granularity), "by_source": dict(sources.most_common()),
        "mention_attention": mention, "mention_attention_share": mention / total if total else 0.0,
        "largest_main_share": max((r["share"] for r in by_main), default=0.0),
    }


def render_stats(stats: dict[str, Any]) -> str:
    lines = [f"{stats['ideas']} ideas from {stats['papers']} papers "
             f"({stats['untagged']} untagged), {stats.get('experiences', 0)} experiences; sources: "
             + ", ".join(f"{k} {v}" for k, v in list(stats["by_source"].items())[:5])
             + (", ..." if len(stats["by_source"]) > 5 else ""), ""]
    lines.append(f"{'target':<12} {'granularity':<10} {'main category':<52} {'ideas':>6} {'share':>6}")
    for row in stats["by_main"]:
        bar = "#" * round(30 * row["share"])
        lines.append(f"{row['target']:<12} {row['granularity']:<10} {row['main']:<52} {row['ideas']:>6} "
                     f"{100 * row['share']:>5.1f}% {bar}")
    lines.append("")
    lines.append("by granularity: " + ", ".join(f"{g} {n}" for g, n in stats["by_granularity"].items()))
    lines.append(f"ideas mentioning attention/transformers: {stats['mention_attention']} "
                 f"({100 * stats['mention_attention_share']:.1f} %; FairNAD saw ~70 % attention in raw extraction)")
    return "\n".join(lines) + "\n"


def plot_stats(stats: dict[str, Any], path: Path) -> None:
    import matplotlib  # lazy: loads matplotlib (start-up time)

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: loads matplotlib (start-up time)


    rows = stats["by_main"]
    fig, ax = plt.subplots(figsize=(9, 0.35 * len(rows) + 1.2))
    colours = ["tab:blue" if r["target"] == "performance" else "tab:orange" for r in rows]
    ax.barh([r["main"] for r in rows][::-1], [100 * r["share"] for r in rows][::-1], color=colours[::-1])
    ax.set_xlabel("share of ideas (%)")
    ax.set_title(f"{stats['ideas']} ideas by main category (blue: performance, orange: efficiency)")
    fig.tight_layout()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110)
    plt.close(fig)
    atomic_write_bytes(Path(path), buf.getvalue())
