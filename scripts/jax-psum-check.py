"""JAX's psum over NCCL with the reduction-server plugin: one rank, run under the launcher.

    eval "$(python3 -m reducer.cli.main nccl-plugin --install /tmp/rs-plugin)"
    NCCL_COLLNET_ENABLE=1 NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,NET,TUNING \\
      python3 -m reducer.cli.main launch --workers 2 --reducers 2 -- python3 scripts/jax-psum-check.py

Each rank is its own NCCL "host" (NCCL_HOSTID) so that two processes can share one GPU, as in
scripts/gpu-check.sh; JAX's process group comes from the launcher's RANK / WORLD_SIZE /
MASTER_ADDR / MASTER_PORT. Prints one `JAXPSUM {json}` line per case; exit 1 on a wrong sum.
"""

from __future__ import annotations

import json
import os
import sys

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
os.environ["NCCL_HOSTID"] = f"rs-jax-host-{rank}"
os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")

import jax  # noqa: E402  (after the environment NCCL and XLA read)
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

jax.distributed.initialize(
    coordinator_address=f"{os.environ['MASTER_ADDR']}:{int(os.environ['MASTER_PORT']) + 7}",
    num_processes=world,
    process_id=rank,
)
psum = jax.pmap(lambda v: jax.lax.psum(v, "i"), axis_name="i")
want = sum(range(1, world + 1))
failed = 0
for dtype in (jnp.float32, jnp.bfloat16):
    for nbytes in (4 << 10, 1 << 20, 64 << 20):
        n = nbytes // jnp.dtype(dtype).itemsize
        x = jnp.full((jax.local_device_count(), n), rank + 1, dtype=dtype)
        out = np.asarray(psum(x).astype(jnp.float32))
        ok = bool((out == want).all())
        failed += not ok
        print(
            "JAXPSUM "
            + json.dumps(
                {
                    "rank": rank,
                    "dtype": jnp.dtype(dtype).name,
                    "bytes": nbytes,
                    "ok": ok,
                    "devices": jax.device_count(),
                    "jax": jax.__version__,
                }
            ),
            flush=True,
        )
sys.exit(1 if failed else 0)
