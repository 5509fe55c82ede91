"""The GPU check: the NCCL plugin against real NCCL on one machine with one CUDA GPU.

``python -m reducer.gpucheck [--quick]`` (or ``scripts/gpu-check.sh``). Modules, one job each:
``main`` (the phases and the verdict), ``phases`` (one launcher run and what it left),
``worker`` (one NCCL rank), ``nccl_log`` (NCCL_DEBUG=INFO parser), ``verdict`` (the checks and
the JSON summary), ``environment`` (GPU/PyTorch probe, plugin install). Nothing here imports
torch at import time. docs/nccl-plugin.md, "GPU check".
"""
