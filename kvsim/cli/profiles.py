"""The profile commands: `kvsim calibrate` (time the Triton kernels and GEMMs on a GPU into a profile CSV)
and `kvsim import-profile` (convert a measured profile into kvsim's). Listed in `kvsim.cli.COMMANDS`, imported
only when one of them runs; its annotations are objects, as `kvsim.cli` explains."""

import dataclasses
import os
import sys
from pathlib import Path
from typing import Annotated

import typer

from kvsim.cli.shared import (
    DEFAULT_GPU,
    DEFAULT_MODEL,
    GpuOpt,
    KvDtypeOpt,
    ModelOpt,
    TpOpt,
    parse_int_list,
    user_errors,
)
from kvsim.model.errors import KvsimError, shown


def calibrate(
    gpu: Annotated[str, typer.Option("--gpu", help="Name recorded in the profile (e.g. h200)")],
    model: ModelOpt = DEFAULT_MODEL,
    output: Annotated[str | None, typer.Option("--output", "-o", help="Profile CSV to write")] = None,
    block_size: Annotated[str, typer.Option("--block-sizes", help="Comma-separated block sizes")] = "16",
    kv_cache_dtype: Annotated[str, typer.Option("--kv-cache-dtype", help="auto or fp8")] = "auto",
    tensor_parallel_size: TpOpt = None,
    quick: Annotated[bool, typer.Option("--quick", help="A small grid for a smoke run")] = False,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Print the grid and exit")] = False,
) -> None:
    """Time the Triton paged-attention kernels and the model's GEMMs on a GPU into a profile CSV."""
    from kvsim.latency.profiles.native import check_one_line
    from kvsim.model.capacity import check_parallel
    from kvsim.model.config import load_model
    from kvsim.model.engine_config import make_engine
    from kvsim.results.output_checks import check_output_file

    with user_errors():
        if not gpu.strip():  # recorded as the profile's gpu: an empty one is checked against no GPU when read
            raise KvsimError(f"--gpu={gpu!r}: is empty: name the GPU the profile is measured on (e.g. h200)")
        check_one_line("--gpu", gpu)  # its `# gpu:` line: refused by the reader only after the whole calibration
        spec = load_model(model)
        if spec.mla is not None:  # its grid timed K/V heads of hidden_size / heads, a profile for another model
            raise KvsimError(f"--model={model!r}: {spec.name} caches MLA's latent (kv_lora_rank + qk_rope_head_dim "
                             "per token), which the Triton paged-attention kernel kvsim calibrate times does not "
                             "read; its GEMMs are MLA's own projections too")
        engine = make_engine(tensor_parallel_size=tensor_parallel_size)
        check_parallel(spec, engine)  # the per-GPU shapes below divide by TP: a TP vLLM cannot shard has none
        if kv_cache_dtype not in ("auto", "fp8"):
            raise KvsimError(f"--kv-cache-dtype={kv_cache_dtype!r}: calibrate measures auto or fp8")
        sizes = parse_int_list(block_size, "--block-sizes")
        for size in sizes:  # a block size vLLM accepts, as a scenario's engine.block_size (0 divided by zero)
            try:
                make_engine(block_size=size)
            except KvsimError as error:
                raise KvsimError(f"--block-sizes={block_size!r}: {error}") from None
        if output is not None:  # refuse before loading torch and measuring, and in the dry run that plans the real one
            check_output_file(output)
        from kernels import grid as calibration_grid  # standard library only: --dry-run needs no torch

        commit = calibration_grid.KERNELS_COMMIT_ENV  # its `# kernels_commit:` line, as --gpu's
        check_one_line(commit, os.environ.get(commit, ""))

        shapes = calibration_grid.LayerShapes(
            num_heads=max(1, spec.num_attention_heads // engine.tensor_parallel_size),
            num_kv_heads=max(1, spec.num_kv_heads // engine.tensor_parallel_size), head_dim=spec.head_dim,
            hidden_size=spec.hidden_size, intermediate_size=spec.intermediate_size // engine.tensor_parallel_size,
            vocab_size=spec.vocab_size // engine.tensor_parallel_size, gated_mlp=spec.gated_mlp, dtype=spec.dtype,
            kv_dtype=kv_cache_dtype, model=spec.name, tensor_parallel_size=engine.tensor_parallel_size)
        base = calibration_grid.QUICK_GRID if quick else calibration_grid.DEFAULT_GRID
        grid = dataclasses.replace(base, block_sizes=tuple(sizes))
        points = calibration_grid.plan(shapes, grid)
        if dry_run:
            from kvsim.results.render import rows_to_csv

            sys.stdout.write(rows_to_csv([{k: p.get(k, "") for k in ("kind", "op", "batch", "context_len",
                                                                        "query_len", "num_tokens", "k", "n",
                                                                        "block_size")} for p in points]))
            typer.echo(f"{len(points)} measurements for {spec.name} ({shapes})", err=True)
            return
        if output is None:  # an argument, checked before the machine: it said "no CUDA device" first
            raise KvsimError("--output is required: the profile CSV to write")
        try:
            from kernels.device import has_cuda  # asked before the harness imports triton (see there)

            if not has_cuda():
                raise KvsimError("no CUDA device: calibration times kernels on a GPU (--dry-run prints the grid)")
            from kernels import calibrate as harness
        except ImportError as error:
            raise KvsimError(f"calibrate needs torch and triton ({error.name} is missing): "
                             "pip install -e '.[kernels]'") from None
        from rich.progress import Progress

        with Progress(transient=True) as bar:
            task = bar.add_task("calibrating", total=len(points))
            path = harness.measure(shapes, grid, gpu, Path(output),
                                   progress=lambda done, total: bar.update(task, completed=done))
    typer.echo(f"profile written to {path}")


def import_profile(
    source: Annotated[str, typer.Argument(help="An LLMServingSim profile bundle folder, a Vidur mlp.csv or a "
                                               "kvsim profile CSV")],
    output: Annotated[str, typer.Option("--output", "-o", help="kvsim profile CSV to write")],
    model: ModelOpt = DEFAULT_MODEL,
    gpu: GpuOpt = DEFAULT_GPU,
    tensor_parallel_size: TpOpt = None,
    kv_cache_dtype: KvDtypeOpt = None,
    repository: Annotated[str | None, typer.Option("--source-repository", help="e.g. owner/name")] = None,
    commit: Annotated[str | None, typer.Option("--source-commit", help="The source's commit")] = None,
    licence: Annotated[str | None, typer.Option("--source-licence", help="The source's licence, e.g. MIT")] = None,
) -> None:
    """Convert a measured profile into kvsim's profile CSV, checked against the model, GPU, KV dtype and TP."""
    from kvsim.latency.profiles import with_source
    from kvsim.latency.profiles.loader import load_profile
    from kvsim.latency.profiles.native import write_native
    from kvsim.model.config import load_gpu, load_model
    from kvsim.model.engine_config import make_engine
    from kvsim.results.output_checks import check_output_file

    with user_errors():
        check_output_file(output)  # as given: Path('') is the working folder; and before the profile is read
        check_commit(commit)
        engine = make_engine(tensor_parallel_size=tensor_parallel_size, kv_cache_dtype=kv_cache_dtype)
        profile = load_profile(source, load_model(model), load_gpu(gpu), engine)
        path = write_native(with_source(profile, repository, commit, licence), Path(output))
    typer.echo(f"profile {profile.name} ({len(profile.rows)} rows, kinds {', '.join(sorted(profile.kinds()))}) "
               f"written to {path}")


def check_commit(commit: str | None) -> None:
    """A `KvsimError` naming `--source-commit` unless it is a git commit, 7 to 40 hex digits (an abbreviated or a
    full SHA-1): `xyz` was recorded as the profile's source commit. A blank one is `with_source`'s to refuse."""
    import re

    if commit is not None and commit.strip() and re.fullmatch(r"[0-9a-fA-F]{7,40}", commit) is None:
        raise KvsimError(f"--source-commit {shown(commit)}: not a git commit (7 to 40 hex digits)")
