"""The Hub stand-in (tests/plugins/hub_standin.py) answers the real huggingface_hub client as the
Hub does: snapshots, single files, pinned revisions, the Hub's errors, gated repos, the offline
cache, listings and byte ranges, and a dataset repo that `datasets` then reads."""
from __future__ import annotations

from pathlib import Path

import huggingface_hub
import pytest
from huggingface_hub import HfApi, HfFileSystem, hf_hub_download, snapshot_download
from huggingface_hub.errors import (EntryNotFoundError, GatedRepoError, HfHubHTTPError,
                                    LocalEntryNotFoundError, RepositoryNotFoundError,
                                    RevisionNotFoundError)

from tests.plugins.hub_standin import HubStandIn, git_blob_oid

MODEL = "kvbench-tests/tiny-model"
MODEL_FILES = {
    "config.json": b'{"hidden_size": 8}',
    "tokenizer.json": b'{"vocab": ["a", "b"]}',
    "weights/model-00001.bin": bytes(range(256)),
    "weights/model-00002.bin": b"\x00\x01" * 300,
}


@pytest.fixture
def hub(monkeypatch):
    # HF_HUB_OFFLINE from the environment (a shell, CI) would have the client refuse every
    # request; it reads the variable once, at import, so the module's switch is turned off
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    with HubStandIn() as standin:
        yield standin


def files_under(folder: str | Path) -> dict[str, bytes]:
    folder = Path(folder)
    return {p.relative_to(folder).as_posix(): p.read_bytes()
            for p in folder.rglob("*") if p.is_file()}


def test_snapshot_download_fetches_every_file_into_the_commit_folder(hub, tmp_path):
    sha = hub.add_model(MODEL, MODEL_FILES)

    folder = snapshot_download(MODEL, endpoint=hub.endpoint, cache_dir=tmp_path / "hub",
                               token=False)

    assert Path(folder).name == sha
    assert Path(folder).parent.name == "snapshots"
    assert files_under(folder) == MODEL_FILES
    assert sorted(hub.downloaded()) == sorted(f"{MODEL}/{path}" for path in MODEL_FILES)
    # the branch was resolved once; every file was then fetched at the commit it named
    file_gets = [path for method, path, _ in hub.requests
                 if method == "GET" and "/resolve/" in path]
    assert file_gets and all(f"/resolve/{sha}/" in path for path in file_gets)


def test_a_folder_adds_every_file_under_it(hub, tmp_path):
    source = tmp_path / "source"
    for path, content in MODEL_FILES.items():
        (source / path).parent.mkdir(parents=True, exist_ok=True)
        (source / path).write_bytes(content)
    hub.add_model(MODEL, source)

    assert sorted(HfApi(endpoint=hub.endpoint, token=False).list_repo_files(MODEL)) == \
        sorted(MODEL_FILES)


def test_allow_patterns_fetch_only_the_matching_files(hub, tmp_path):
    hub.add_model(MODEL, MODEL_FILES)

    folder = snapshot_download(MODEL, allow_patterns=["config.json"], endpoint=hub.endpoint,
                               cache_dir=tmp_path / "hub", token=False)

    assert hub.downloaded() == [f"{MODEL}/config.json"]
    assert files_under(folder) == {"config.json": MODEL_FILES["config.json"]}


@pytest.mark.parametrize("pin", ["commit", "tag"])
def test_a_pinned_revision_gives_the_older_files_after_a_newer_commit(hub, tmp_path, pin):
    old_files = {"config.json": b'{"version": 1}'}
    new_files = {"config.json": b'{"version": 2}', "extra.txt": b"added later"}
    old_sha = hub.add_model(MODEL, old_files, tag="v1")
    new_sha = hub.add_model(MODEL, new_files)
    revision = old_sha if pin == "commit" else "v1"

    pinned = snapshot_download(MODEL, revision=revision, endpoint=hub.endpoint,
                               cache_dir=tmp_path / "hub", token=False)
    latest = snapshot_download(MODEL, endpoint=hub.endpoint, cache_dir=tmp_path / "hub",
                               token=False)

    assert (Path(pinned).name, files_under(pinned)) == (old_sha, old_files)
    assert (Path(latest).name, files_under(latest)) == (new_sha, new_files)


def test_a_branch_with_slashes_travels_url_encoded(hub, tmp_path):
    hub.add_model(MODEL, {"config.json": b'{"on": "main"}'})
    pr_sha = hub.add_model(MODEL, {"config.json": b'{"on": "pr"}'}, branch="refs/pr/1")

    path = hf_hub_download(MODEL, "config.json", revision="refs/pr/1", endpoint=hub.endpoint,
                           cache_dir=tmp_path / "hub", token=False)

    assert Path(path).read_bytes() == b'{"on": "pr"}'
    assert Path(path).parent.name == pr_sha
    assert any("/resolve/refs%2Fpr%2F1/" in path for _, path, _ in hub.requests)


def test_an_unknown_revision_raises_revision_not_found(hub, tmp_path):
    hub.add_model(MODEL, MODEL_FILES)

    with pytest.raises(RevisionNotFoundError):
        snapshot_download(MODEL, revision="no-such-branch", endpoint=hub.endpoint,
                          cache_dir=tmp_path / "hub", token=False)
    with pytest.raises(RevisionNotFoundError):
        hf_hub_download(MODEL, "config.json", revision="f" * 40, endpoint=hub.endpoint,
                        cache_dir=tmp_path / "hub", token=False)
    assert hub.downloaded() == []


def test_a_missing_repo_raises_repository_not_found(hub, tmp_path):
    hub.add_model(MODEL, MODEL_FILES)

    with pytest.raises(RepositoryNotFoundError) as raised:
        snapshot_download("kvbench-tests/no-such-model", endpoint=hub.endpoint,
                          cache_dir=tmp_path / "hub", token=False)
    assert not isinstance(raised.value, GatedRepoError)  # its subclass: not the error meant here
    with pytest.raises(RepositoryNotFoundError):  # a dataset of the model's name is another repo
        hf_hub_download(MODEL, "config.json", repo_type="dataset", endpoint=hub.endpoint,
                        cache_dir=tmp_path / "hub", token=False)


def test_a_missing_file_raises_entry_not_found(hub, tmp_path):
    hub.add_model(MODEL, MODEL_FILES)

    with pytest.raises(EntryNotFoundError):
        hf_hub_download(MODEL, "no-such-file.json", endpoint=hub.endpoint,
                        cache_dir=tmp_path / "hub", token=False)


@pytest.mark.parametrize("token, status", [(False, 401), ("hf_not_the_right_one", 403)])
def test_a_gated_repo_refuses_a_caller_without_its_token(hub, tmp_path, token, status):
    hub.add_model(MODEL, MODEL_FILES)
    hub.gate(MODEL, token="hf_granted")

    with pytest.raises(GatedRepoError) as raised:
        snapshot_download(MODEL, endpoint=hub.endpoint, cache_dir=tmp_path / "hub", token=token)

    assert raised.value.response.status_code == status
    assert raised.value.repo_id == MODEL
    assert MODEL in str(raised.value)
    assert hub.downloaded() == []


def test_a_gated_repo_serves_the_holder_of_its_token(hub, tmp_path):
    hub.add_model(MODEL, MODEL_FILES)
    hub.gate(MODEL, token="hf_granted")

    folder = snapshot_download(MODEL, endpoint=hub.endpoint, cache_dir=tmp_path / "hub",
                               token="hf_granted")

    assert files_under(folder) == MODEL_FILES
    assert HfApi(endpoint=hub.endpoint, token=False).model_info(MODEL).gated == "manual"


def test_hf_hub_download_fetches_one_file(hub, tmp_path):
    sha = hub.add_model(MODEL, MODEL_FILES)

    path = hf_hub_download(MODEL, "weights/model-00001.bin", endpoint=hub.endpoint,
                           cache_dir=tmp_path / "hub", token=False)

    assert Path(path).read_bytes() == MODEL_FILES["weights/model-00001.bin"]
    assert Path(path).parts[-4:] == ("snapshots", sha, "weights", "model-00001.bin")
    # the snapshot links to a blob named by the file's ETag, its git blob id
    assert Path(path).resolve().name == git_blob_oid(MODEL_FILES["weights/model-00001.bin"])
    assert hub.downloaded() == [f"{MODEL}/weights/model-00001.bin"]


def test_offline_reads_a_cached_snapshot_and_fails_on_an_uncached_one(hub, tmp_path):
    hub.add_model(MODEL, MODEL_FILES)
    hub.add_model("kvbench-tests/never-fetched", MODEL_FILES)
    online = snapshot_download(MODEL, endpoint=hub.endpoint, cache_dir=tmp_path / "hub",
                               token=False)
    requests_online = len(hub.requests)

    offline = snapshot_download(MODEL, local_files_only=True, endpoint=hub.endpoint,
                                cache_dir=tmp_path / "hub", token=False)
    with pytest.raises(LocalEntryNotFoundError):
        snapshot_download("kvbench-tests/never-fetched", local_files_only=True,
                          endpoint=hub.endpoint, cache_dir=tmp_path / "hub", token=False)

    assert offline == online
    assert files_under(offline) == MODEL_FILES
    assert len(hub.requests) == requests_online


def test_a_dataset_repo_downloads_and_datasets_reads_its_configs(hub, tmp_path):
    datasets = pytest.importorskip("datasets",
                                   reason="needs datasets: pip install 'kvbench[datasets]'")
    readme = (b"---\nconfigs:\n"
              b"- config_name: easy\n  data_files:\n  - split: test\n    path: easy/*.jsonl\n"
              b"- config_name: hard\n  data_files:\n  - split: test\n    path: hard/*.jsonl\n"
              b"---\n# Toy QA\n")
    hub.add_dataset("kvbench-tests/toy-qa", {
        "README.md": readme,
        "easy/part-0.jsonl": b'{"question": "1+1", "answer": "2"}\n',
        "hard/part-0.jsonl": b'{"question": "17*3", "answer": "51"}\n'
                             b'{"question": "2**10", "answer": "1024"}\n',
    })

    folder = snapshot_download("kvbench-tests/toy-qa", repo_type="dataset", endpoint=hub.endpoint,
                               cache_dir=tmp_path / "hub", token=False)
    rows = datasets.load_dataset(folder, "hard", split="test", cache_dir=str(tmp_path / "ds"))

    assert "datasets--kvbench-tests--toy-qa" in Path(folder).parts
    assert rows.to_list() == [{"question": "17*3", "answer": "51"},
                              {"question": "2**10", "answer": "1024"}]
    assert "datasets/kvbench-tests/toy-qa/hard/part-0.jsonl" in hub.downloaded()


def test_a_long_listing_comes_in_pages_linked_by_the_link_header(hub):
    hub.tree_page_size = 3
    files = {f"shard-{i:02d}.bin": bytes([i]) for i in range(7)}
    hub.add_model(MODEL, files)

    listed = HfApi(endpoint=hub.endpoint, token=False).list_repo_files(MODEL)

    tree_pages = [path for _, path, _ in hub.requests if "/tree/" in path]

    assert sorted(listed) == sorted(files)
    assert len(tree_pages) == 3  # 7 entries, 3 a page


def test_a_listing_expanded_names_the_commit_that_last_changed_each_entry(hub):
    first = hub.add_model(MODEL, MODEL_FILES)
    second = hub.add_model(MODEL, {**MODEL_FILES, "config.json": b'{"hidden_size": 16}'})
    api = HfApi(endpoint=hub.endpoint, token=False)

    top = {entry.path: entry for entry in api.list_repo_tree(MODEL, expand=True)}
    inside = [entry.path for entry in api.list_repo_tree(MODEL, "weights")]

    assert set(top) == {"config.json", "tokenizer.json", "weights"}
    assert isinstance(top["weights"], huggingface_hub.hf_api.RepoFolder)
    assert top["config.json"].last_commit.oid == second
    assert top["tokenizer.json"].last_commit.oid == first
    assert top["weights"].last_commit.oid == first
    assert sorted(inside) == ["weights/model-00001.bin", "weights/model-00002.bin"]


def test_paths_info_describes_the_paths_that_exist(hub):
    hub.add_model(MODEL, MODEL_FILES)

    found = HfApi(endpoint=hub.endpoint, token=False).get_paths_info(
        MODEL, ["config.json", "weights", "no-such-file"])

    assert [(type(entry).__name__, entry.path) for entry in found] == [
        ("RepoFile", "config.json"), ("RepoFolder", "weights")]
    assert found[0].size == len(MODEL_FILES["config.json"])


def test_a_byte_range_is_served_from_the_middle_of_a_file(hub):
    hub.add_model(MODEL, MODEL_FILES)
    content = MODEL_FILES["weights/model-00001.bin"]
    fs = HfFileSystem(endpoint=hub.endpoint, token=False, skip_instance_cache=True)

    with fs.open(f"{MODEL}/weights/model-00001.bin", "rb", block_size=16) as file:
        file.seek(100)
        middle = file.read(10)

    assert middle == content[100:110]
    assert any(method == "GET" and "range" in headers for method, _, headers in hub.requests)


def test_an_endpoint_it_does_not_serve_is_a_404_seen_in_requests(hub):
    hub.add_model(MODEL, MODEL_FILES)

    with pytest.raises(HfHubHTTPError) as raised:
        HfApi(endpoint=hub.endpoint, token=False).list_repo_refs(MODEL)

    assert raised.value.response.status_code == 404
    assert hub.requests[-1][:2] == ("GET", f"/api/models/{MODEL}/refs")
