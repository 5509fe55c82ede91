"""Asynchronous all-reduce with tensor fusion, fingerprints and handles.

``Communicator.allreduce_async(array)`` returns a :class:`Handle` at once; the arrays are
reduced in the background, many small ones fused into one round per (dtype, wire dtype, op),
sent straight from the arrays' memory, and the results land in the callers' arrays
(docs/worker-library.md). Under compression, float32 arrays travel as 16-bit values converted
chunk by chunk by the transport (the client's ``compression=``): the engine copies nothing.

- ``planner``: the cut rule (where fused buffers begin and end), pure and deterministic;
- ``engine``: ``FusionEngine`` (the threads, agreement probes, scatter-gather rounds in flight)
  and ``Handle``;
- ``diagnosis``: fingerprints of the submitted tensors and the mismatch diagnosis that names the
  first tensor the workers disagree on.
"""
from .engine import PROBE_TAG, FusionEngine, Handle, compression_dtype

__all__ = ["Handle", "FusionEngine", "compression_dtype", "PROBE_TAG"]
