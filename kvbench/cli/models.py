"""`kvbench models`: prepare the bundled model, download a hub model ahead of a run, and inspect
which layers a method compresses."""
from __future__ import annotations

from pathlib import Path

import click
from rich.markup import escape

from kvbench.cli.common import console, fail


@click.group()
def models():
    """Prepare and inspect models."""


@models.command("prepare")
@click.argument("name")
@click.option("--force", is_flag=True, help="Convert again even if already prepared.")
def models_prepare(name, force):
    """Convert a bundled model (e.g. smollm2-135m) into a local checkpoint once, and verify it."""
    from kvbench.models import BUNDLED, prepare_bundled
    from kvbench.config.registry import did_you_mean

    name = name.removeprefix("bundled:")
    if name not in BUNDLED:
        fail(f"unknown bundled model {name!r}.{did_you_mean(name, BUNDLED)} "
             f"Known: {', '.join(BUNDLED)}")
    path = prepare_bundled(name, force=force, log=lambda m: console.print(escape(m)))
    console.print(f"[green]ready:[/] bundled:{name} at {path}")


@models.command("download")
@click.argument("spec")
@click.option("--trust-remote-code", is_flag=True,
              help="Also fetch the checkpoint's own modelling code (*.py), for a suite that"
                   " sets trust_remote_code: true.")
@click.option("--tokenizer-only", is_flag=True,
              help="Only the config, tokenizer and generation config (what a client of a server"
                   " that has the model needs), not the weights.")
def models_download(spec, trust_remote_code, tokenizer_only):
    """Download a hub model (Org/Name, or Org/Name@revision: a branch, tag or commit) into the
    Hugging Face cache ahead of a run: what a cluster's shared cache, or a machine that runs
    offline later (HF_HUB_OFFLINE=1), needs. The files a checkpoint needs are fetched: config,
    generation config, tokenizer and chat template, and its weights (safetensors; .bin where it
    has none). HF_TOKEN is the token for a gated model; HF_HUB_CACHE or HF_HOME say where the
    cache is."""
    from kvbench import hub
    from kvbench.models.info import checkpoint_folder, describe_model

    if hub.HubRef.parse(spec) is None:
        fail(f"{spec!r} is not a hub model id: Org/Name or Org/Name@revision")
    try:
        commit = describe_model(spec).revision
        say = lambda text: console.print(escape(text))  # noqa: E731
        folder = checkpoint_folder(spec, commit, weights=not tokenizer_only,
                                   code=trust_remote_code,
                                   progress=hub.DownloadProgress(say, say))
    except ValueError as exc:
        fail(str(exc))
    files = [path for path in sorted(Path(folder).rglob("*")) if path.is_file()]
    size = sum(path.stat().st_size for path in files)
    console.print(f"[green]ready:[/] {escape(spec)} at commit {commit}: {len(files)} files,"
                  f" {hub.readable_size(size)} in {escape(folder)}")


@models.command("inspect")
@click.argument("spec")
@click.option("--backend", type=click.Choice(["torch", "mlx"]), default="torch",
              show_default=True, help="mlx: also what mlx-lm would run otherwise than torch "
                                      "(the model refused there), and which methods have an MLX "
                                      "implementation.")
def models_inspect(spec, backend):
    """Each layer's kind (full, sliding window, linear attention or Mamba state, softcap, sinks,
    MLA), read from the model's config, and whether each shipped method runs on it or is refused,
    and why. SPEC: a checkpoint folder, bundled:NAME, tiny:KIND or a hub id (Org/Name[@revision]:
    its config and tokenizer are fetched, not its weights). The weights are not loaded (with torch, the model is built on the meta device to read its attention
    modules)."""
    from rich.table import Table

    from kvbench.methods import METHODS, build_method, has_implementation
    from kvbench.models.info import describe_model, method_refusal
    from kvbench.models.layer_kinds import SLIDING, hosted_layers, kept_windows, layers_text

    try:
        info = describe_model(spec)
    except ValueError as exc:
        fail(str(exc))
    if info.refused:
        console.print(f"[red]every method refused[/]: {escape(info.refused)}")
        return
    kinds = _with_modules(spec, info.layer_kinds)
    layers = Table(title=f"{spec}: {len(kinds)} layers")
    layers.add_column("layer", justify="right")
    layers.add_column("type (the library's name)")
    layers.add_column("kind")
    layers.add_column("hosted by")
    kept = kept_windows(kinds)
    for i, kind in enumerate(kinds):
        hosted_by = (f"nothing of its own (layer {kind.reads}'s)" if kind.reads is not None
                     else "the method's policy" if kind.compressed else
                     "a quantizer's policy (layers: full leaves it to the library)"
                     if kind.mixer == SLIDING and i not in kept else "the library's own layer")
        layers.add_row(str(i), kind.layer_type, escape(kind.describe()), escape(hosted_by))
    console.print(layers)
    everything = _mlx_refusal(spec) if backend == "mlx" else None
    if everything:
        console.print(f"[red]refused on mlx[/]: {escape(everything)}")
        return
    methods = Table(title=f"shipped methods (default settings), on {backend}")
    methods.add_column("method")
    methods.add_column("on this model")
    for name in METHODS.names():
        try:
            settings = build_method(name, METHODS.get(name).conformance_params[0])
        except ValueError as exc:
            methods.add_row(name, escape(f"not built: {exc}"))
            continue
        why = method_refusal(settings, info, kinds, backend)
        if backend == "mlx" and not why and not has_implementation(type(settings), "mlx"):
            why = "no MLX implementation"
        hosted = hosted_layers(settings, kinds)
        verdict = (f"[red]refused[/]: {escape(why)}" if why else
                   f"runs, compressing {layers_text(hosted)}" if hosted else "runs")
        methods.add_row(name, verdict)
    console.print(methods)


def _mlx_refusal(spec: str) -> str | None:
    try:
        from kvbench.models.mlx_loading import mlx_refusal
    except ImportError as exc:
        fail(f"--backend mlx needs mlx-lm ({exc}): pip install 'kvbench[mlx]'")
    return mlx_refusal(spec)


def _with_modules(spec: str, kinds: list) -> list:
    """The kinds with what the attention modules say (sinks), where torch is installed."""
    try:
        from kvbench.models.loading import meta_layer_kinds
    except ImportError:
        return kinds
    return meta_layer_kinds(spec) or kinds

