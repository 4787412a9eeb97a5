"""A local stand-in for the Hugging Face Hub's HTTP API: the real `huggingface_hub` client (and
what reads through it) downloads from it over HTTP on 127.0.0.1, so tests of fetching models and
datasets need no network and mock nothing in the client. Point the client at `endpoint`.

Served, as huggingface_hub 2.4 calls them:
- GET  /api/{models|datasets}/{repo}[/revision/{rev}]     repo_info, model_info, dataset_info
- GET  /api/{models|datasets}/{repo}/tree/{rev}[/{path}]  list_repo_tree, list_repo_files
  (`recursive`, `expand`; pages of `tree_page_size` entries, chained by `Link: <…>; rel="next"`)
- POST /api/{models|datasets}/{repo}/paths-info/{rev}     get_paths_info, HfFileSystem.info
- HEAD, GET /[datasets/]{repo}/resolve/{rev}/{path}       hf_hub_download, snapshot_download
  (plain HTTP: no xet headers; GET honours a single `Range`)
Anything else is a 404 without an error code. Every request is kept in `requests`.

Files are git blobs outside LFS: a file's ETag and tree oid are its git blob sha1. As on the
Hub, a gated repo's info and listing stay public and only its files ask for the token.
Standard library only, so a test needs no optional extra to use it."""
from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlencode, urlsplit

# The repo id is one or two segments; the regexes backtrack to tell "gpt2/tree" from "org/gpt2".
API_PATH = re.compile(r"^/api/(models|datasets)/([^/]+(?:/[^/]+)?)"
                      r"(?:/(revision|tree|paths-info)/([^/]+)(?:/(.*))?)?$")
RESOLVE_PATH = re.compile(r"^/(datasets/)?([^/]+(?:/[^/]+)?)/resolve/([^/]+)/(.+)$")
BYTE_RANGE = re.compile(r"^bytes=(\d*)-(\d*)$")
KIND_OF_API = {"models": "model", "datasets": "dataset"}
URL_PREFIX = {"model": "", "dataset": "datasets/"}  # as the client builds resolve URLs


def git_blob_oid(content: bytes) -> str:
    """The id git, and the Hub for a file outside LFS, gives to a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


def _truthy(value) -> bool:
    return str(value).lower() in ("true", "1")


def _byte_range(header: str, size: int) -> tuple[int, int] | None:
    """[start, end) asked by `bytes=a-b` (b inclusive), `bytes=a-` or `bytes=-n`; None when the
    header asks nothing this file holds."""
    match = BYTE_RANGE.match(header.strip())
    if not match or not (match[1] or match[2]):
        return None
    if not match[1]:
        start, end = max(size - int(match[2]), 0), size
    else:
        start, end = int(match[1]), min(int(match[2]) + 1, size) if match[2] else size
    return (start, end) if start < end else None


@dataclass(eq=False)
class Commit:
    sha: str
    parent: Commit | None
    files: dict[str, bytes]
    title: str
    date: str

    def __post_init__(self):
        self.oids = {path: git_blob_oid(content) for path, content in self.files.items()}

    def folders(self) -> set[str]:
        return {path.rsplit("/", depth)[0]
                for path in self.files for depth in range(1, path.count("/") + 1)}

    def listing(self, under: str, recursive: bool) -> list[str] | None:
        """The files and folders in folder `under` ("" for the root); None if it is no folder."""
        folders = self.folders()
        if under and under not in folders:
            return None
        prefix = f"{under}/" if under else ""
        inside = [p for p in [*self.files, *folders] if p.startswith(prefix)]
        return sorted(p for p in inside if recursive or "/" not in p[len(prefix):])

    def state(self, path: str) -> tuple:
        """The (path, oid) of the file `path` or of every file under the folder `path`."""
        return tuple(sorted((p, oid) for p, oid in self.oids.items()
                            if p == path or p.startswith(f"{path}/")))

    def last_change(self, path: str) -> Commit:
        commit = self
        while commit.parent is not None and commit.parent.state(path) == commit.state(path):
            commit = commit.parent
        return commit

    def describe(self, path: str, expand: bool) -> dict | None:
        """A tree / paths-info entry, as RepoFile and RepoFolder parse it; None if absent."""
        if path in self.files:
            entry = {"type": "file", "oid": self.oids[path], "size": len(self.files[path]),
                     "path": path}
        elif path in self.folders():
            tree_oid = hashlib.sha1(repr(self.state(path)).encode()).hexdigest()
            entry = {"type": "directory", "oid": tree_oid, "size": 0, "path": path}
        else:
            return None
        if expand:
            last = self.last_change(path)
            entry["lastCommit"] = {"id": last.sha, "title": last.title, "date": last.date}
        return entry


@dataclass
class Repo:
    commits: dict[str, Commit] = field(default_factory=dict)
    branches: dict[str, str] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)

    def resolve(self, revision: str) -> Commit | None:
        """A branch, else a tag, else a full commit sha, as the Hub reads a revision."""
        sha = self.branches.get(revision) or self.tags.get(revision) or revision
        return self.commits.get(sha)


class HubStandIn:
    """`with HubStandIn() as hub:` serves the repos added to it at hub.endpoint until the block
    ends. `requests` holds (method, path with query, headers with lower-cased names) of every
    request, in order."""

    def __init__(self, *, tree_page_size: int = 1000):  # the Hub's page, without expand
        self.tree_page_size = tree_page_size
        self.requests: list[tuple[str, str, dict]] = []
        self._downloaded: list[str] = []
        self._repos: dict[tuple[str, str], Repo] = {}
        self._gates: dict[tuple[str, str], str] = {}
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
        self._server.daemon_threads = True  # a client's idle keep-alive connection holds no exit
        self._server.hub = self
        self.endpoint = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def start(self) -> HubStandIn:
        if not self._thread.is_alive():
            self._thread.start()
        return self

    def close(self) -> None:
        if self._thread.is_alive():  # shutdown() waits for a serve_forever that never began
            self._server.shutdown()
        self._server.server_close()

    __enter__ = start

    def __exit__(self, *exc) -> None:
        self.close()

    def add_model(self, repo_id: str, files: dict[str, bytes] | Path, *, branch: str = "main",
                  tag: str | None = None) -> str:
        """A new commit of model `repo_id` holding exactly `files` (path -> content, or every
        file under a folder); `branch` moves to it, `tag` names it too. Returns its sha."""
        return self._commit("model", repo_id, files, branch, tag)

    def add_dataset(self, repo_id: str, files: dict[str, bytes] | Path, *, branch: str = "main",
                    tag: str | None = None) -> str:
        """As add_model, for dataset `repo_id`."""
        return self._commit("dataset", repo_id, files, branch, tag)

    def gate(self, repo_id: str, token: str, repo_type: str = "model") -> None:
        """Serve the files of `repo_id` only to `Authorization: Bearer <token>`: 401 without a
        token, 403 with another, each with X-Error-Code GatedRepo (the client's GatedRepoError)."""
        with self._lock:
            self._gates[(repo_type, repo_id)] = token

    def downloaded(self) -> list[str]:
        """The files whose content a GET was served, as "[datasets/]{repo_id}/{path}", in order."""
        with self._lock:
            return list(self._downloaded)

    def _commit(self, kind: str, repo_id: str, files, branch: str, tag: str | None) -> str:
        if not isinstance(files, dict):
            folder = Path(files)
            files = {p.relative_to(folder).as_posix(): p.read_bytes()
                     for p in sorted(folder.rglob("*")) if p.is_file()}
        with self._lock:
            repo = self._repos.setdefault((kind, repo_id), Repo())
            parent = repo.commits.get(repo.branches.get(branch, ""))
            seed = [kind, repo_id, parent and parent.sha, sorted(
                (path, git_blob_oid(content)) for path, content in files.items())]
            sha = hashlib.sha1(json.dumps(seed).encode()).hexdigest()
            date = datetime.now(timezone.utc).isoformat(timespec="milliseconds")
            repo.commits[sha] = Commit(sha, parent, dict(files), f"Upload {len(files)} files",
                                       date.replace("+00:00", "Z"))
            repo.branches[branch] = sha
            if tag is not None:
                repo.tags[tag] = sha
        return sha

    def _repo_info(self, kind: str, repo_id: str, commit: Commit) -> dict:
        """What /api/{models|datasets}/{repo} answers, as ModelInfo and DatasetInfo parse it."""
        return {"_id": commit.sha[:24], "id": repo_id, "sha": commit.sha,
                "author": repo_id.partition("/")[0] if "/" in repo_id else None,
                "lastModified": commit.date, "private": False,
                "gated": "manual" if (kind, repo_id) in self._gates else False,
                "disabled": False, "downloads": 0, "likes": 0, "tags": [],
                "usedStorage": sum(map(len, commit.files.values())),
                "siblings": [{"rfilename": path, "size": len(content), "blobId": commit.oids[path]}
                             for path, content in sorted(commit.files.items())]}


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the client's connection pool expects

    def log_message(self, *args) -> None:
        pass  # `requests` is the log; stderr stays the test's

    def do_GET(self) -> None:
        hub: HubStandIn = self.server.hub
        with hub._lock:
            hub.requests.append((self.command, self.path,
                                 {name.lower(): value for name, value in self.headers.items()}))
        url = urlsplit(self.path)
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if (match := API_PATH.match(url.path)) and \
                self.command == ("POST" if match[3] == "paths-info" else "GET"):
            kind, repo_id = KIND_OF_API[match[1]], unquote(match[2])
            commit = self._find(hub, kind, repo_id, unquote(match[4] or "main"), gated=False)
            if commit is not None:
                self._api(hub, kind, repo_id, commit, match[3], unquote(match[5] or ""), url, body)
        elif (match := RESOLVE_PATH.match(url.path)) and self.command in ("GET", "HEAD"):
            kind, repo_id = ("dataset" if match[1] else "model"), unquote(match[2])
            commit = self._find(hub, kind, repo_id, unquote(match[3]), gated=True)
            if commit is not None:
                self._file(hub, kind, repo_id, commit, unquote(match[4]))
        else:
            self._reply(404, {"error": "Not Found"})

    do_HEAD = do_POST = do_GET

    def _find(self, hub: HubStandIn, kind: str, repo_id: str, revision: str,
              gated: bool) -> Commit | None:
        """The commit `revision` names, or None once the Hub's error is answered."""
        token = self.headers.get("Authorization", "").removeprefix("Bearer ").strip() or None
        with hub._lock:
            repo, gate = hub._repos.get((kind, repo_id)), hub._gates.get((kind, repo_id))
            commit = repo.resolve(revision) if repo is not None else None
        if repo is None:  # the Hub tells an anonymous caller 401, not telling what exists
            self._error(404 if token else 401, "RepoNotFound", "Repository not found")
        elif gated and gate is not None and token != gate:
            visit = f"{hub.endpoint}/{URL_PREFIX[kind]}{repo_id}"
            if token is None:
                self._error(401, "GatedRepo", f"Access to {kind} {repo_id} is restricted. You must "
                            "have access to it and be authenticated to access it. Please log in.")
            else:
                self._error(403, "GatedRepo", f"Access to {kind} {repo_id} is restricted and you "
                            f"are not in the authorized list. Visit {visit} to ask for access.")
        elif commit is None:
            self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        else:
            return commit
        return None

    def _api(self, hub: HubStandIn, kind: str, repo_id: str, commit: Commit, action: str | None,
             path: str, url, body: bytes) -> None:
        if action in (None, "revision"):
            self._reply(200, hub._repo_info(kind, repo_id, commit))
        elif action == "tree":
            query = {name: values[-1] for name, values in parse_qs(url.query).items()}
            listing = commit.listing(path.strip("/"), _truthy(query.get("recursive")))
            if listing is None:
                self._error(404, "EntryNotFound", f"{path} does not exist on {commit.sha}")
                return
            start = int(query.get("cursor", 0))
            end = start + hub.tree_page_size
            expand = _truthy(query.get("expand"))
            headers = {}
            if end < len(listing):  # the client follows the next page's absolute URL as given
                next_query = urlencode({**query, "cursor": end})
                headers["Link"] = f'<{hub.endpoint}{url.path}?{next_query}>; rel="next"'
            self._reply(200, [commit.describe(p, expand) for p in listing[start:end]], headers)
        else:  # paths-info: the client posts a form (paths repeated); a JSON body reads the same
            is_json = self.headers.get("Content-Type", "").startswith("application/json")
            form = json.loads(body or b"{}") if is_json else parse_qs(body.decode())
            paths, expand = form.get("paths", []), form.get("expand", False)
            paths = [paths] if isinstance(paths, str) else paths
            expand = _truthy(expand[-1] if isinstance(expand, list) else expand)
            entries = (commit.describe(p.strip("/"), expand) for p in paths)
            self._reply(200, [entry for entry in entries if entry is not None])

    def _file(self, hub: HubStandIn, kind: str, repo_id: str, commit: Commit, path: str) -> None:
        # X-Repo-Commit on a miss too: the client caches the absence under that commit
        headers = {"X-Repo-Commit": commit.sha}
        if path not in commit.files:
            self._error(404, "EntryNotFound", f"{path} does not exist on {commit.sha}", headers)
            return
        content, status = commit.files[path], 200
        headers |= {"ETag": f'"{commit.oids[path]}"', "Accept-Ranges": "bytes"}
        if self.command == "GET" and (asked := self.headers.get("Range")):
            span = _byte_range(asked, len(content))
            if span is None:
                headers["Content-Range"] = f"bytes */{len(content)}"
                self._reply(416, b"", headers, "text/plain")
                return
            headers["Content-Range"] = f"bytes {span[0]}-{span[1] - 1}/{len(content)}"
            content, status = content[span[0]:span[1]], 206
        if self.command == "GET":  # before the body goes out: the client may look at once
            with hub._lock:
                hub._downloaded.append(f"{URL_PREFIX[kind]}{repo_id}/{path}")
        self._reply(status, content, headers, "application/octet-stream")

    def _error(self, status: int, code: str, message: str, headers: dict | None = None) -> None:
        """An error as hf_raise_for_status reads it: X-Error-Code picks the exception class."""
        self._reply(status, {"error": message},
                    {**(headers or {}), "X-Error-Code": code, "X-Error-Message": message})

    def _reply(self, status: int, body, headers: dict | None = None,
               content_type: str = "application/json") -> None:
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        # A HEAD answer states the length a GET's body would have: the client reads the size there
        for name, value in {"Content-Type": content_type, "Content-Length": str(len(data)),
                            **(headers or {})}.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)


def point_kvbench_at(hub: HubStandIn, monkeypatch, cache: Path) -> dict[str, str]:
    """Send kvbench's hub client (kvbench.hub, which reads the environment at each call) to the
    stand-in, with its own cache and no token; the variables set, for a child process too."""
    from huggingface_hub import constants

    # HF_HUB_OFFLINE from the environment (a shell, CI) would have the client refuse every
    # request; it reads the variable once, at import, so the module's switch is turned off
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_TOKEN", "HF_HOME"):
        monkeypatch.delenv(name, raising=False)
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_CACHE": str(cache)}
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return env


def main() -> None:
    """Serve tiny checkpoints as hub repositories until interrupted, for trying kvbench against
    a hub by hand: `python -m tests.plugins.hub_standin REPO[=FOLDER] ...` (a folder's files,
    or a tiny checkpoint made here, tests.plugins.checkpoints, its weights seeded by its place
    on the line; a repository named twice gets two commits) prints each commit and the
    HF_ENDPOINT to use."""
    import argparse
    import tempfile
    import time

    from tests.plugins.checkpoints import checkpoint_files, save_checkpoint

    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("repos", nargs="+", metavar="REPO[=FOLDER]")
    args = parser.parse_args()
    with HubStandIn() as hub, tempfile.TemporaryDirectory() as made:
        for number, item in enumerate(args.repos):
            repo, _, folder = item.partition("=")
            folder = Path(folder) if folder else save_checkpoint(Path(made) / str(number),
                                                                 seed=number)
            print(f"{repo}@{hub.add_model(repo, checkpoint_files(folder))}", flush=True)
        print(f"HF_ENDPOINT={hub.endpoint}", flush=True)
        while True:
            time.sleep(3600)


if __name__ == "__main__":
    main()
