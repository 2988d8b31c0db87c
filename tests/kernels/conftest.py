"""Kernel tests run on the CPU under Triton's interpreter unless a CUDA device is there."""

import os

import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    os.environ["TRITON_INTERPRET"] = "1"
pytest.importorskip("triton")
