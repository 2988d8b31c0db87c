"""`load_profile`: the importer a path calls for (bundle folder, Vidur `mlp.csv` or kvsim CSV), then the checks."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from kvsim.latency.profiles import Profile, bundle, check_profile, native, vidur
from kvsim.latency.profiles.checks import check_model_name, check_rows
from kvsim.model.errors import KvsimError, near_path, not_a_file

if TYPE_CHECKING:
    from kvsim.model.config import GPUSpec
    from kvsim.model.engine_config import EngineConfig
    from kvsim.model.spec import ModelSpec


def load_profile(path: str | Path, model: ModelSpec, gpu: GPUSpec, engine: EngineConfig) -> Profile:
    """Import the profile at `path` (a bundle folder, a Vidur `mlp.csv` or a kvsim CSV) and check it:
    physical rows (`checks.check_rows`), the model's name, then its shapes, dtype, GPU and TP."""
    problem = not_a_file(path, missing="no such file or folder")
    if problem is not None:  # a FIFO was "no such file or folder"
        hint = near_path(Path(path)) if problem == "no such file or folder" else ""
        raise KvsimError(f"profile {str(path) or repr(path)}: {problem}{hint}")
    path = Path(path)
    if path.is_dir():
        profile = bundle.read_bundle(path, engine.tensor_parallel_size)
    elif vidur.is_vidur_csv(path):
        profile = vidur.read_vidur_mlp(path, engine.tensor_parallel_size)
    else:
        profile = native.read_native(path)
    check_rows(profile, path)
    check_model_name(profile, model)
    check_profile(profile, model, gpu, engine)
    return profile
