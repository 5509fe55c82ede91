"""A short torch job for tests/client/test_exit_clean.py, run under `reduction-server launch`.

Each process all-reduces and reduces through the "reduction_server" backend in several process
groups (the default one and new_group()s), or trains a tiny DDP model with reducer.torch's hook,
checks every result exactly, and exits. Its first atexit handler (registered before anything
else, so it runs last, just before the interpreter finalizes) fails the process with exit status
3 if a thread the library started is still alive then: such a thread can call into C++ while the
interpreter finalizes and abort the process (issue 24).

    python exit_clean_worker.py --mode backend|hook [--groups N] [--clean-up all|none|even]

--clean-up: which ranks call HookState.close() and dist.destroy_process_group() before returning
(even: the even ranks; the others rely on the library to end its threads at exit).
"""

from __future__ import annotations

import atexit
import os
import sys
import threading

LIBRARY_THREADS = ("reducer.torch-", "reducer-fusion-", "reducer-net-", "reducer-probe-")


def _no_library_thread_left() -> None:
    left = [t.name for t in threading.enumerate() if t.is_alive() and t.name.startswith(LIBRARY_THREADS)]
    if left:
        sys.stderr.write(f"library threads still alive when the interpreter finalizes: {', '.join(left)}\n")
        sys.stderr.flush()
        os._exit(3)


atexit.register(_no_library_thread_left)  # first registered: runs after every other handler

import argparse  # noqa: E402

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import reducer.torch as rst  # noqa: E402
from reducer.cluster import discover_worker  # noqa: E402


def collectives(rank: int, world: int, groups: int) -> None:
    """all_reduce (sum, avg) and reduce in the default group and `groups - 1` new groups."""
    pgs = [None] + [dist.new_group(list(range(world)), backend="reduction_server") for _ in range(groups - 1)]
    for g, pg in enumerate(pgs):
        x = torch.arange(1000, dtype=torch.float64) * (rank + 1) + g
        dist.all_reduce(x, group=pg)
        want = torch.arange(1000, dtype=torch.float64) * (world * (world + 1) // 2) + g * world
        assert torch.equal(x, want), f"group {g}: all_reduce sum differs"
        y = torch.full((257,), float(rank + 1), dtype=torch.float32)
        dist.all_reduce(y, op=dist.ReduceOp.AVG, group=pg)
        assert torch.equal(y, torch.full((257,), (world + 1) / 2, dtype=torch.float32)), f"group {g}: avg differs"
        z = torch.full((33,), rank + 1, dtype=torch.int64)
        dist.reduce(z, dst=0, group=pg)
        expect = world * (world + 1) // 2 if rank == 0 else rank + 1
        assert torch.equal(z, torch.full((33,), expect, dtype=torch.int64)), f"group {g}: reduce differs"


def train_with_hook(steps: int) -> rst.HookState:
    """A tiny DDP model over gloo whose gradients go through reducer.torch's allreduce hook."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(16, 4))
    state = rst.HookState()
    model.register_comm_hook(state, rst.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(steps):
        x = torch.full((8, 16), float(dist.get_rank() + step))
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    weights = model.module.weight.detach().clone()
    gathered = [torch.empty_like(weights) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, weights)
    assert all(torch.equal(gathered[0], w) for w in gathered), "the replicas differ"
    return state


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--mode", choices=["backend", "hook"], default="backend")
    p.add_argument("--groups", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument(
        "--clean-up",
        choices=["all", "none", "even"],
        default="all",
        help="ranks that call HookState.close() and dist.destroy_process_group()",
    )
    args = p.parse_args()
    torch.set_num_threads(1)
    info = discover_worker()
    backend = "reduction_server" if args.mode == "backend" else "gloo"
    dist.init_process_group(backend, rank=info.rank, world_size=info.world_size)
    state = None
    if args.mode == "backend":
        collectives(info.rank, info.world_size, args.groups)
    else:
        state = train_with_hook(args.steps)
    print(f"rank {info.rank}: results exact", flush=True)
    if args.clean_up == "all" or (args.clean_up == "even" and info.rank % 2 == 0):
        if state is not None:
            state.close()
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
