"""`kvbench env`: the machine fingerprint stored with every result."""
from __future__ import annotations

import click
from rich.markup import escape

from kvbench.cli.common import DEVICE, console, err, fail


@click.command()
@click.option("--device", default="auto", show_default=True, type=DEVICE, metavar="DEVICE",
              help="The device whose name and memory the fingerprint holds: auto, cpu, cuda,"
                   " cuda:N or mps.")
def env(device):
    """Print the machine fingerprint stored with every result."""
    from kvbench.backends.torch_backend import resolve_device
    from kvbench.hardware import fingerprint, kvbench_git_sha

    try:
        resolved = resolve_device(device)
    except ValueError as exc:  # a device this machine lacks: say what it has
        fail(str(exc))
    info = fingerprint(str(resolved))
    info["git_sha"] = kvbench_git_sha()  # of the kvbench that runs, as results record it
    for key, value in info.items():
        console.print(f"[bold]{key}[/]: {escape(str(value))}")
    try:
        from kvbench.backends.mlx_backend import blas_info
        from kvbench.hardware import mlx_device
    except ImportError:
        console.print("[bold]mlx[/]: not installed (pip install 'kvbench[mlx]')")
        return
    blas, reference = blas_info()
    console.print(f"[bold]mlx_device[/]: {mlx_device()}")
    console.print(f"[bold]mlx_blas[/]: {escape(blas)}")
    if reference and mlx_device() == "cpu":
        err.print(
            "[yellow]warning:[/] MLX's CPU matrix products run on the reference BLAS (~50x slower"
            " than OpenBLAS): MLX runs here are for correctness, not speed. For a fast one, see"
            " README: MLX on Linux."
        )
