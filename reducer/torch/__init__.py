"""PyTorch integration: DDP communication hooks and the "reduction_server" torch.distributed backend.

Importing this module registers the backend, so either of these is enough (docs/pytorch.md):

    import reducer.torch as rst
    ddp = DDP(model, bucket_cap_mb=64)
    ddp.register_comm_hook(rst.HookState(), rst.allreduce_hook)     # gradients through the reducers

    import reducer.torch  # noqa: F401
    dist.init_process_group("reduction_server")                     # every all_reduce through the reducers

PyTorch is an optional dependency; the rest of the library works without it.
"""

from __future__ import annotations

from ..wording import install_hint as _install_hint

try:
    import torch as _torch
    import torch.distributed as _dist
except ImportError as _exc:  # torch missing (or broken): say how to get it
    raise ImportError(
        "reducer.torch needs PyTorch, which could not be imported "
        f"({_exc}): install it with {_install_hint('torch', 'torch')}"
    ) from _exc

if not _dist.is_available():  # pragma: no cover - builds without distributed support
    raise ImportError(
        f"reducer.torch needs torch.distributed, which this PyTorch build ({_torch.__version__}) does not "
        "include: install a PyTorch build with distributed support (the CPU build: "
        "pip install torch --index-url https://download.pytorch.org/whl/cpu)"
    )

from .backend import BACKEND_NAME, ReductionServerProcessGroup, register_backend  # noqa: E402
from .hooks import HookState, allreduce_hook, bf16_compress_hook, fp16_compress_hook  # noqa: E402

register_backend()

__all__ = [
    "BACKEND_NAME",
    "HookState",
    "ReductionServerProcessGroup",
    "allreduce_hook",
    "bf16_compress_hook",
    "fp16_compress_hook",
    "register_backend",
]
