"""Asynchronous all-reduce with tensor fusion, fingerprints and handles.

``Communicator.allreduce_async(array)`` returns a :class:`Handle` at once; the arrays are
reduced in the background, many small ones fused into one round per (dtype, wire dtype, op),
sent straight from the arrays' memory, and the results land in the callers' arrays
(docs/worker-library.md). Under compression, float32 arrays travel as 16-bit values converted
chunk by chunk by the transport (the client's ``compression=``): the engine copies nothing.

- ``planner``: the cut rule (where fused buffers begin and end), pure and deterministic;
- ``engine``: ``FusionEngine``, the coordinator that wires the parts below together;
- ``agreement``: the submitted entries and the agreement probes' values, cut by the planner;
- ``rounds``: entries, rounds and their (address, length) segments;
- ``cycle``, ``network``, ``probe``: the fusion, network and probe threads;
- ``ledger``, ``handle``, ``stats``: pending entries, ``Handle`` completion, counters;
- ``lifecycle``: the engine lock (its docstring states the lock discipline), closing, the error;
- ``diagnosis``: fingerprints of the submitted tensors and the mismatch diagnosis that names the
  first tensor the workers disagree on.
"""

from .engine import FusionEngine, compression_dtype
from .handle import Handle
from .rounds import PROBE_TAG

__all__ = ["Handle", "FusionEngine", "compression_dtype", "PROBE_TAG"]
