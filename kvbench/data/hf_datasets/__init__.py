"""Rows of a dataset on the Hugging Face Hub, for text, QA files and a dataset benchmark's samples
alike: `<dataset>[@<revision>]`, a config and a split. The files of that config are downloaded
into the Hugging Face cache on first use (kvbench.hub: HF_TOKEN, HF_HUB_OFFLINE and a pinned
revision as for models), then read by `datasets` from that folder; nothing sets the hub offline
for the process."""
from __future__ import annotations

from typing import Any

import yaml

from kvbench import hub


def datasets_module(described: str, error: type[ValueError] = ValueError) -> Any:
    """The `datasets` module; `error` naming `described` when it is not installed."""
    try:
        import datasets
    except ImportError as exc:
        raise error(f"{described} needs the datasets package: pip install datasets") from exc
    datasets.disable_progress_bars()  # kvbench shows its own progress
    return datasets


def load_hub_rows(described: str, name: str, config: str | None, split: str,
                  error: type[ValueError] = ValueError,
                  progress: hub.DownloadProgress | None = None) -> Any:
    """datasets' rows of `split` of the hub dataset `name` (Org/Name[@revision]) in `config`;
    `error` naming `described` when it cannot be had."""
    datasets = datasets_module(described, error)
    ref = hub.HubRef.parse(name)
    if ref is None:
        raise error(f"{described}: {name!r} is not a hub dataset id (Org/Name[@revision])")
    try:
        card = hub.file_at(ref, "README.md", repo_type="dataset", optional=True)
        files = config_files(card.read_text(encoding="utf-8") if card else "", config)
        folder = hub.snapshot(ref, hub.commit_of(card) if card else ref.revision,
                              ["README.md", *files], repo_type="dataset", progress=progress)
    except ValueError as exc:  # a HubError, or a config the card does not list
        raise error(f"{described}: {exc}") from None
    commit = hub.commit_of(folder)
    try:
        return datasets.load_dataset(str(folder), config, split=split)
    except Exception as exc:  # datasets raises many kinds for data it cannot read
        raise error(f"{described}: `datasets` could not read config {config!r}, split {split!r}"
                    f" of {ref} (commit {commit[:12]}): {exc}") from exc


def config_files(card: str, config: str | None) -> list[str]:
    """The data files of `config` (None: the default one) as the dataset card's YAML header
    lists them under `configs:`; ["*"] (every file) where the card lists no configs."""
    header = card.split("---")[1] if card.startswith("---") and card.count("---") >= 2 else ""
    configs = (yaml.safe_load(header) or {}).get("configs") if header.strip() else None
    if not isinstance(configs, list) or not configs:
        return ["*"]
    named = {entry.get("config_name", "default"): entry for entry in configs
             if isinstance(entry, dict)}
    chosen = named.get(config) if config else next(
        (entry for entry in named.values() if entry.get("default")), named.get("default"))
    if chosen is None:
        raise ValueError(f"no config {config!r} in the dataset card; its configs:"
                         f" {', '.join(named)}")
    files = chosen.get("data_files", [])
    files = files if isinstance(files, list) else [files]
    paths = [item.get("path") if isinstance(item, dict) else item for item in files]
    return [p for path in paths for p in (path if isinstance(path, list) else [path]) if p]
