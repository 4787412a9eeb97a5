"""Files from the Hugging Face Hub: a model's checkpoint (`Org/Name`, `Org/Name@revision`) and a
dataset's files, downloaded on first use into the Hugging Face cache, as transformers and
datasets would, with kvbench's own progress and errors that say what to do.

The hub's settings are read from the environment at each call (HF_ENDPOINT, HF_HUB_CACHE or
HF_HOME, HF_TOKEN, HF_HUB_OFFLINE), not once at import, so a process sees what its caller set.
Offline, only what the cache holds is used; a revision is resolved to its commit once, and
every later read asks for that commit.
"""
from __future__ import annotations

import io
import os
import re
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

_REF = re.compile(r"^(?P<repo>[A-Za-z0-9][\w.-]*/[\w.-]+)(?:@(?P<revision>[\w./-]+))?$")
COMMIT = re.compile(r"^[0-9a-f]{40}$")

# What a checkpoint needs: its config and generation config, tokenizer files, chat templates,
# and its weights (safetensors; PyTorch .bin files only where a repo has no safetensors).
SMALL_FILES = ("*.json", "*.jinja", "*.model", "*.tiktoken", "*.txt", "tokenizer*")
WEIGHTS = ("*.safetensors",)
OLD_WEIGHTS = ("*.bin",)
CODE = ("*.py",)  # a checkpoint's own modelling code, fetched only under trust_remote_code
LEFT_OUT = ("original/*",)  # Llama repos' consolidated weights for Meta's own code


class HubError(ValueError):
    """A hub model or dataset that cannot be had: the message names it and what to do."""


@dataclass(frozen=True)
class DownloadProgress:
    """Where a download's progress goes: `status` as it goes (bytes so far, at most once in
    `every_s` seconds: a live display's status line, or a log), `finished` once when the files
    are all in (a line that stays)."""

    status: Callable[[str], None] = lambda text: None
    finished: Callable[[str], None] = lambda text: None
    every_s: float = 1.0


@dataclass(frozen=True)
class HubRef:
    """A repository on the hub and the revision asked for (None: its main branch)."""

    repo_id: str
    revision: str | None = None

    @classmethod
    def parse(cls, text: str) -> HubRef | None:
        """`Org/Name` or `Org/Name@revision`; None for anything else."""
        found = _REF.match(text)
        return found and cls(found["repo"], found["revision"])

    def __str__(self) -> str:
        return self.repo_id + (f"@{self.revision}" if self.revision else "")


def endpoint() -> str:
    return (os.environ.get("HF_ENDPOINT") or _constants().ENDPOINT).rstrip("/")


def cache_dir() -> Path:
    """The Hugging Face cache, as huggingface_hub resolves it from the environment now."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    return Path(_constants().HF_HUB_CACHE)


def offline() -> bool:
    """HF_HUB_OFFLINE (or TRANSFORMERS_OFFLINE) as set now or when huggingface_hub was imported."""
    now = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return now.strip().upper() in ("1", "ON", "YES", "TRUE") or _constants().HF_HUB_OFFLINE


def commit_of(path: str | Path) -> str:
    """The commit of a snapshot folder of the cache, or of a file in it."""
    parts = Path(path).parts  # .../models--Org--Name/snapshots/<commit>/...
    return next(parts[i + 1] for i in range(1, len(parts) - 1) if parts[i] == "snapshots"
                and parts[i - 1].startswith(("models--", "datasets--")))


def file_at(ref: HubRef, filename: str, repo_type: str = "model", revision: str | None = None,
            optional: bool = False) -> Path | None:
    """One small file of a repository (config.json, README.md), downloaded if the cache lacks
    it; `revision` (a commit) in place of the ref's own. Its folder is the snapshot of the
    commit the revision names (commit_of). None for a file the repository does not have, when
    `optional`."""
    from huggingface_hub import errors, hf_hub_download

    with explained(ref, repo_type, filename):
        try:
            return Path(hf_hub_download(
                ref.repo_id, filename, repo_type=repo_type, revision=revision or ref.revision,
                cache_dir=cache_dir(), endpoint=endpoint(), local_files_only=offline()))
        except errors.EntryNotFoundError as exc:
            if optional and not isinstance(exc, errors.LocalEntryNotFoundError):
                return None
            raise


def snapshot(ref: HubRef, revision: str | None, patterns: list[str], repo_type: str = "model",
             progress: DownloadProgress | None = None) -> Path:
    """The cache's folder of `revision` (best a commit; None: main) with every file of the
    repository that matches `patterns` (fnmatch), downloading what it lacks, its progress told
    to `progress`. Its name is the commit (commit_of)."""
    from huggingface_hub import snapshot_download

    reporting = _reporting(progress, str(ref)) if progress else None
    with explained(ref, repo_type):
        folder = Path(snapshot_download(
            ref.repo_id, repo_type=repo_type, revision=revision, cache_dir=cache_dir(),
            endpoint=endpoint(), local_files_only=offline(), allow_patterns=patterns,
            ignore_patterns=list(LEFT_OUT) if repo_type == "model" else None,
            tqdm_class=reporting))
    if reporting is not None and reporting.downloaded:
        progress.finished(f"downloaded {ref.repo_id} (commit {commit_of(folder)[:12]}):"
                          f" {readable_size(reporting.downloaded)}")
    return folder


def checkpoint_patterns(ref: HubRef, commit: str, weights: bool = True,
                        code: bool = False) -> list[str]:
    """The files of a checkpoint kvbench reads: the small ones, its weights (safetensors, or
    .bin where it has none) when `weights`, its own code when `code`."""
    patterns = [*SMALL_FILES, *(CODE if code else ())]
    if not weights:
        return patterns
    if offline():  # the listing needs the network; the cache says what was fetched
        return patterns + [*WEIGHTS, *OLD_WEIGHTS]
    from huggingface_hub import HfApi

    with explained(ref):
        files = HfApi(endpoint=endpoint()).list_repo_files(ref.repo_id, revision=commit)
    has_safetensors = any(name.endswith(".safetensors") for name in files)
    return patterns + list(WEIGHTS if has_safetensors else OLD_WEIGHTS)


def checkpoint(ref: HubRef, commit: str, weights: bool = True, code: bool = False,
               progress: DownloadProgress | None = None) -> Path:
    """The folder of a model checkpoint at `commit`, downloaded on first use: config,
    tokenizer, generation config and (with `weights`) weights."""
    folder = snapshot(ref, commit, checkpoint_patterns(ref, commit, weights, code),
                      progress=progress)
    if weights and not any(folder.glob("*.safetensors")) and not any(folder.glob("*.bin")):
        raise HubError(
            f"model {ref}: the cache's snapshot of commit {commit[:12]} holds no weights"
            + (f" and HF_HUB_OFFLINE is set; download it first with network (kvbench models"
               f" download {ref})" if offline() else " (no .safetensors or .bin file in the"
               " repository)"))
    return folder


@contextmanager
def explained(ref: HubRef, repo_type: str = "model", filename: str | None = None) -> Iterator[None]:
    """huggingface_hub's errors as a HubError naming the repository and what to do."""
    from huggingface_hub import errors

    what = f"{'dataset' if repo_type == 'dataset' else 'model'} {ref}"
    page = f"{endpoint()}/{'datasets/' if repo_type == 'dataset' else ''}{ref.repo_id}"
    try:
        yield
    except errors.GatedRepoError:
        raise HubError(f"{what} is gated on the hub: ask for access at {page}, then set HF_TOKEN"
                       " to a token of the account that has it"
                       + (" (the token set now is not granted access)" if _token() else ""))
    except errors.RepositoryNotFoundError:
        raise HubError(f"{what}: no such repository on the hub at {endpoint()} (a private one"
                       " needs HF_TOKEN set to a token that can read it)")
    except errors.RevisionNotFoundError:
        raise HubError(f"{what}: the hub has no revision {ref.revision!r} of {ref.repo_id}"
                       " (a branch, a tag or a commit sha)")
    except errors.LocalEntryNotFoundError as exc:
        if offline():
            raise HubError(f"{what} is not in the local Hugging Face cache ({cache_dir()}) and"
                           " HF_HUB_OFFLINE is set: download it where there is network (kvbench"
                           f" models download {ref}), or unset HF_HUB_OFFLINE") from None
        raise HubError(f"{what}: the hub at {endpoint()} cannot be reached and the local cache"
                       f" ({cache_dir()}) does not hold it ({_cause(exc)})") from None
    except errors.EntryNotFoundError:
        raise HubError(f"{what} has no file {filename!r}"
                       + (" (not a transformers checkpoint)" if filename == "config.json"
                          else "")) from None
    except errors.HfHubHTTPError as exc:
        raise HubError(f"{what}: the hub at {endpoint()} answered {exc}") from None
    except OSError as exc:  # a connection refused, a full disk
        raise HubError(f"{what}: {exc}") from None


def _cause(exc: BaseException) -> str:
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return f"{type(exc).__name__}: {exc}"


def _token() -> str | None:
    from huggingface_hub import get_token

    return get_token()


def _constants():
    from huggingface_hub import constants

    return constants


def _reporting(progress: DownloadProgress, what: str) -> type:
    """A tqdm class for snapshot_download that tells progress.status its byte counts instead
    of drawing a bar of its own; its `downloaded` is the bytes fetched in all."""
    from tqdm.std import tqdm

    class Reported(tqdm):
        last = 0.0  # when any bar of this download last told its status
        downloaded = 0

        def __init__(self, *args, **kwargs):
            kwargs.update(disable=False, file=io.StringIO())
            super().__init__(*args, **kwargs)

        def display(self, msg=None, pos=None):
            if self.unit != "B" or not self.total:
                return True
            Reported.downloaded = max(Reported.downloaded, self.n)
            if time.monotonic() - Reported.last >= progress.every_s:
                Reported.last = time.monotonic()
                progress.status(f"downloading {what}: {readable_size(self.n)} of"
                                f" {readable_size(self.total)}")
            return True

    return Reported


def readable_size(count: float) -> str:
    """Bytes as a person reads them: 582.8 kB, 16.1 GB."""
    for unit in ("B", "kB", "MB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "B" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.1f} GB"
