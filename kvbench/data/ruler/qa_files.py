"""The QA haystacks RULER reads (qa.py's read_squad / read_hotpotqa): a local file, or rows of a
Hugging Face Hub dataset."""
from __future__ import annotations

import json
from pathlib import Path

from kvbench.data.hf_datasets import load_hub_rows
from kvbench.data.ruler.tasks import QARecord


def read_qa(path_or_source: str, kind: str) -> list[QARecord]:
    """The questions of a QA file as qa.py's read_squad ("squad": SQuAD v2 dev JSON,
    dev-v2.0.json; unanswerable questions left out) or read_hotpotqa ("hotpotqa": HotpotQA dev
    distractor JSON; every listed paragraph is one of the question's documents). Documents are
    deduplicated and sorted into one pool. `path_or_source` is a JSON file, or
    "hf:<dataset>[@<revision>][:<config>]:<split>" from the hub (rajpurkar/squad_v2,
    hotpotqa/hotpot_qa:distractor)."""
    if kind not in ("squad", "hotpotqa"):
        raise ValueError(f"QA kind must be 'squad' or 'hotpotqa', got {kind!r}")
    if path_or_source.startswith("hf:"):
        rows = hf_rows(path_or_source)
        data = squad_from_rows(rows) if kind == "squad" else hotpotqa_from_rows(rows)
    else:
        path = Path(path_or_source).expanduser()
        if not path.is_file():
            raise ValueError(f"QA file {str(path)!r} does not exist")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except json.JSONDecodeError as exc:
            raise ValueError(f"QA file {str(path)!r} is not JSON: {exc}") from exc
    try:
        records = read_squad(data) if kind == "squad" else read_hotpotqa(data)
    except (KeyError, TypeError, IndexError) as exc:
        form = "SQuAD v2 (dev-v2.0.json)" if kind == "squad" else "HotpotQA (dev distractor)"
        raise ValueError(f"{path_or_source!r} is not {form} JSON: {exc!r}") from exc
    if not records:
        raise ValueError(f"{path_or_source!r} holds no answerable question")
    return records


def read_squad(data: dict) -> list[QARecord]:
    docs = sorted({p["context"] for d in data["data"] for p in d["paragraphs"]})
    where = {c: i for i, c in enumerate(docs)}
    pool = tuple(docs)
    records = []
    for d in data["data"]:
        article = [where[p["context"]] for p in d["paragraphs"]]
        for p in d["paragraphs"]:
            own = where[p["context"]]
            for qa in p["qas"]:
                if not qa.get("is_impossible", False):  # SQuAD v1.1 has no such field
                    records.append(QARecord(qa["question"], tuple(a["text"] for a in qa["answers"]),
                                            (own,), tuple(i for i in article if i != own), pool))
    return records


def read_hotpotqa(data: list) -> list[QARecord]:
    def doc(title: str, sentences: list[str]) -> str:
        return f"{title}\n{''.join(sentences)}"

    docs = sorted({doc(t, p) for d in data for t, p in d["context"]})
    where = {c: i for i, c in enumerate(docs)}
    pool = tuple(docs)
    return [QARecord(d["question"], (d["answer"],), tuple(where[doc(t, p)] for t, p in d["context"]),
                     (), pool) for d in data]


def hf_rows(source: str) -> list[dict]:
    parts = source.removeprefix("hf:").split(":")
    if len(parts) not in (2, 3):
        raise ValueError(f"QA source {source!r}: expected hf:<dataset>[:<config>]:<split>")
    name, config, split = (parts[0], None, parts[1]) if len(parts) == 2 else parts
    return list(load_hub_rows(f"QA source {source!r}", name, config, split))


def squad_from_rows(rows: list[dict]) -> dict:
    """rajpurkar/squad_v2 rows (title, context, question, answers{text}) in the official
    file's shape: articles by title, paragraphs by context, in the rows' order."""
    articles: dict[str, dict[str, list]] = {}
    for row in rows:
        texts = list(row["answers"]["text"])
        articles.setdefault(row["title"], {}).setdefault(row["context"], []).append(
            {"question": row["question"], "answers": [{"text": t} for t in texts],
             "is_impossible": not texts})
    return {"data": [{"title": title, "paragraphs": [{"context": c, "qas": qas}
                                                     for c, qas in paragraphs.items()]}
                     for title, paragraphs in articles.items()]}


def hotpotqa_from_rows(rows: list[dict]) -> list:
    """hotpotqa/hotpot_qa rows (context{title, sentences}) in the official file's shape."""
    return [{"question": row["question"], "answer": row["answer"],
             "context": [[t, list(s)] for t, s in zip(row["context"]["title"],
                                                      row["context"]["sentences"])]}
            for row in rows]
