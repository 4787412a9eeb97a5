"""`datasets` read from the local Hugging Face cache only: kvbench has no network at run time.
One place for the offline switches and the "not cached" error, for text, QA files and a
dataset benchmark's rows alike."""
from __future__ import annotations

import os
from typing import Any

NOT_CACHED = "could not be read from the local datasets cache (kvbench reads datasets offline)"


def offline_datasets(described: str, error: type[ValueError] = ValueError) -> Any:
    """The `datasets` module with the network off (set before its import, which reads the
    switches once); `error` naming `described` when it is not installed."""
    os.environ["HF_DATASETS_OFFLINE"] = "1"
    os.environ["HF_HUB_OFFLINE"] = "1"
    try:
        import datasets
    except ImportError as exc:
        raise error(f"{described} needs the datasets package: pip install datasets") from exc
    return datasets


def load_cached(described: str, name: str, config: str | None, split: str,
                error: type[ValueError] = ValueError) -> Any:
    """datasets.load_dataset(name, config, split=split) from the local cache; `error` naming
    `described` when it is not there."""
    datasets = offline_datasets(described, error)
    try:
        return datasets.load_dataset(name, config, split=split)
    except Exception as exc:  # datasets raises many kinds for "not cached"
        raise error(f"{described} {NOT_CACHED}: {exc}") from exc
