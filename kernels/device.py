"""Whether this machine can time kernels, asked of torch alone.

`kvsim calibrate` asks before it imports the harness: triton, imported and then left unused on a machine
without a GPU, makes its bindings (nanobind) print leak reports as the process exits, dozens of lines
after the CLI's one-line error.
"""


def has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
