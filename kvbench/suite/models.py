"""The models a suite names: checkpoint paths resolved against the suite file, and each spec
described once (its limits, for the benchmarks' checks), with an issue wherever a bad one is
named."""
from __future__ import annotations

from pathlib import Path

from kvbench.models.info import ModelInfo, describe_model, expand_home
from kvbench.suite.errors import Issues, Placed


def model_spec(model: Placed[str]) -> str:
    """A checkpoint path relative to the suite file becomes absolute; other specs stay."""
    spec = model.value
    if spec.startswith(("bundled:", "tiny:")):
        return spec
    path = expand_home(spec)
    if path.is_absolute():
        return str(path)
    local = Path(model.doc.file).parent / path
    if local.exists() or spec.startswith("."):
        return str(local.resolve())
    return spec  # a hub id such as HuggingFaceTB/SmolLM2-135M


class ModelDescriber:
    """describe_model once per spec; each place that names a bad model gets the issue."""

    def __init__(self, issues: Issues):
        self.issues = issues
        self.known: dict[str, tuple[ModelInfo | None, str]] = {}
        self.mlx_refusals: dict[str, str | None] = {}

    def __call__(self, model: Placed[str]) -> tuple[ModelInfo | None, bool]:
        spec = model_spec(model)
        if spec not in self.known:
            try:
                self.known[spec] = (describe_model(spec), "")
            except ValueError as exc:
                self.known[spec] = (None, str(exc))
        info, problem = self.known[spec]
        if problem:
            self.issues.add(model.doc, model.path, problem)
        return info, not problem

    def mlx_refusal(self, spec: str) -> str | None:
        """Why mlx-lm would run the model otherwise than torch (kvbench.models.mlx_loading), once
        per spec; None where mlx is not installed (the suite's own checks say so)."""
        if spec not in self.mlx_refusals:
            try:
                from kvbench.models.mlx_loading import mlx_refusal
            except ImportError:
                self.mlx_refusals[spec] = None
            else:
                self.mlx_refusals[spec] = mlx_refusal(spec)
        return self.mlx_refusals[spec]
