"""Offline text for perplexity and friends.

A text source is "pydoc" (Python's own topic help, shipped with every Python), a file path, or
"hf:<dataset>[@<revision>][:<config>]:<split>:<column>", a dataset on the Hugging Face Hub
(kvbench.data.hf_datasets: downloaded on first use).
"""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from kvbench.data.hf_datasets import load_hub_rows
from kvbench.memo import Memo


def pydoc_text() -> str:
    """The pydoc topic pages in sorted key order, blank lines between them."""
    from pydoc_data.topics import topics

    return "\n\n".join(topics[key] for key in sorted(topics))


def load_text(source: str = "pydoc", base_dir: Path | None = None) -> str:
    if source == "pydoc":
        return pydoc_text()
    if source.startswith("hf:"):
        return _hf_text(source)
    path = Path(source).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = Path(base_dir) / path
    if not path.is_file():
        raise ValueError(f"text file {str(path)!r} does not exist")
    return path.read_text(encoding="utf-8")


def parse_hf_source(source: str) -> tuple[str, str | None, str, str]:
    """"hf:<dataset>[:<config>]:<split>:<column>" -> (dataset, config, split, column)."""
    parts = source.removeprefix("hf:").split(":")
    if len(parts) == 3:
        return parts[0], None, parts[1], parts[2]
    if len(parts) == 4:
        return parts[0], parts[1], parts[2], parts[3]
    raise ValueError(f"text {source!r}: expected hf:<dataset>[:<config>]:<split>:<column>")


def _hf_text(source: str) -> str:
    name, config, split, column = parse_hf_source(source)
    rows = load_hub_rows(f"text {source!r}", name, config, split)
    if column not in rows.column_names:
        raise ValueError(f"text {source!r}: no column {column!r}; columns: {rows.column_names}")
    return "\n\n".join(str(value) for value in rows[column])


def tokens_sha256(ids: list[int]) -> str:
    """Identifies a token sequence: results over different tokens are not comparable."""
    return hashlib.sha256(",".join(map(str, ids)).encode()).hexdigest()


def text_tokens(memo: Memo, session: Any, text: str) -> list[int]:
    """`text` as the session's (kvbench.models.session) tokenizer cuts it, tokenised once per
    run (`memo`: the run's) per model and text."""
    return memo.get(("text_tokens", *session.memo_key, text),
                    lambda: session.tokenizer.encode(load_text(text, None)))


def token_window(memo: Memo, session: Any, text: str, offset: int,
                 need: int) -> tuple[list[int], list[int]]:
    """`need` tokens of `text` from `offset` as the session's tokenizer cuts them, and all the
    tokens after them (calibration material that is never the scored text)."""
    tokens = text_tokens(memo, session, text)
    if offset + need > len(tokens):
        raise ValueError(f"text {text!r} has {len(tokens)} tokens; offset + the tokens needed ="
                         f" {offset} + {need} = {offset + need}")
    return tokens[offset : offset + need], tokens[offset + need :]


def resolve_text(text: str, base_dir: Path) -> str:
    """A text file named in a suite is relative to the suite's folder; pydoc and hf: stay."""
    if text == "pydoc" or text.startswith("hf:"):
        return text
    path = Path(text).expanduser()
    return str(path if path.is_absolute() else base_dir / path)


def check_text(text: str) -> None:
    if not (text == "pydoc" or text.startswith("hf:") or Path(text).is_file()):
        raise ValueError(f"text file {text!r} does not exist")
