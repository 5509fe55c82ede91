"""DDP training of a small MLP on scikit-learn's handwritten digits, all-reducing through the reducers.

    pip install torch scikit-learn       # in the environment where reduction-server is installed
    reduction-server launch --workers 2 --reducers 2 -- python examples/pytorch/train_ddp.py

Modes (all from the same seed, so their parameters can be compared):
    (default)        gloo process group + reducer.torch.allreduce_hook: gradients go to the reducers
    --hook bf16|fp16 the compressed hooks
    --no-hook        plain DDP over the "reduction_server" torch.distributed backend
    --backend gloo   plain gloo DDP, for comparison

Each worker reads the usual torchrun variables (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE,
LOCAL_RANK) and finds the reducers by discovery (CLUSTER_SPEC, TF_CONFIG or RS_REDUCERS).
"""
from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", choices=["reduction_server", "gloo", "nccl"], default=None,
                   help="plain DDP over this process group backend, no hook (default: the reducer hook on a "
                        "gloo/nccl group)")
    p.add_argument("--no-hook", action="store_true",
                   help="no comm hook: plain DDP over the reduction_server backend (= --backend reduction_server)")
    p.add_argument("--hook", choices=["allreduce", "bf16", "fp16"], default="allreduce",
                   help="which reducer.torch hook to register in the default mode")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps")
    p.add_argument("--batch-size", type=int, default=32, help="per-worker batch size")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bucket-cap-mb", type=float, default=64.0, help="DDP bucket size (64 MB suits the reducers)")
    p.add_argument("--device", default=None, help="cpu or cuda (default: cuda if available)")
    p.add_argument("--log-every", type=int, default=10, help="print the loss every N steps (rank 0)")
    p.add_argument("--save", default=None,
                   help="save the final parameters (torch.save of the state dict); '{rank}' in the path is "
                        "replaced by the rank, otherwise only rank 0 saves")
    args = p.parse_args(argv)
    args.use_hook = args.backend is None and not args.no_hook
    if args.no_hook and args.backend not in (None, "reduction_server"):
        p.error("--no-hook means DDP over the reduction_server backend; drop it to compare with --backend "
                f"{args.backend}")
    return args


def load_digits_split(seed: int):
    """The 1,797 8x8 digit images shipped with scikit-learn: a fixed 80/20 train/test split."""
    try:
        from sklearn.datasets import load_digits
    except ImportError:
        sys.exit("this example needs scikit-learn: pip install scikit-learn")
    data = load_digits()
    x = torch.tensor(data.data, dtype=torch.float32) / 16.0
    y = torch.tensor(data.target, dtype=torch.int64)
    order = torch.randperm(len(x), generator=torch.Generator().manual_seed(seed))
    n_test = len(x) // 5
    test, train = order[:n_test], order[n_test:]
    return x[train], y[train], x[test], y[test]


def rank_and_world() -> "tuple[int, int]":
    """This process's global rank and the number of processes.

    torchrun sets RANK/WORLD_SIZE per process. Vertex AI (and `reduction-server launch`) set them
    per node, next to a CLUSTER_SPEC and LOCAL_RANK/LOCAL_WORLD_SIZE: then the reducers' own
    discovery gives the global values (node rank x processes per node + local rank).
    """
    if (os.environ.get("CLUSTER_SPEC") or os.environ.get("TF_CONFIG")) and "TORCHELASTIC_RUN_ID" not in os.environ:
        from reducer.cluster import discover_worker

        info = discover_worker()
        return info.rank, info.world_size
    return int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))


def make_model() -> torch.nn.Module:
    return torch.nn.Sequential(
        torch.nn.Linear(64, 128), torch.nn.ReLU(),
        torch.nn.Linear(128, 64), torch.nn.ReLU(),
        torch.nn.Linear(64, 10),
    )


def main(argv=None) -> int:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)  # several workers share a small machine; also keeps runs reproducible

    device_name = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    if args.use_hook:
        backend = "nccl" if device_name == "cuda" else "gloo"
        mode = f"{backend} DDP + reducer.torch {args.hook} hook"
    elif args.backend in (None, "reduction_server"):
        backend, mode = "reduction_server", "plain DDP over the reduction_server backend"
    else:
        backend, mode = args.backend, f"plain {args.backend} DDP"
    if args.use_hook or backend == "reduction_server":
        import reducer.torch as rst  # the hooks; importing also registers the "reduction_server" backend
    rank, world = rank_and_world()
    dist.init_process_group(backend, rank=rank, world_size=world)

    if device_name == "cuda":
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")

    x_train, y_train, x_test, y_test = load_digits_split(args.seed)
    # Each worker trains on its own shard; all shards together are the training set.
    x_shard, y_shard = x_train[rank::world].to(device), y_train[rank::world].to(device)

    model = make_model().to(device)
    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None, bucket_cap_mb=args.bucket_cap_mb)
    if args.use_hook:  # the one line that moves the gradients to the reducers
        hook = {"allreduce": rst.allreduce_hook, "bf16": rst.bf16_compress_hook, "fp16": rst.fp16_compress_hook}
        state = rst.HookState()
        ddp.register_comm_hook(state, hook[args.hook])
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    if rank == 0:
        print(f"training: {mode}, {world} workers, {len(x_shard)} samples per worker, {args.steps} steps",
              flush=True)

    gen = torch.Generator().manual_seed(args.seed + 1 + rank)
    perm = torch.randperm(len(x_shard), generator=gen)
    pos = 0
    t0 = time.perf_counter()
    for step in range(args.steps):
        if pos + args.batch_size > len(perm):
            perm, pos = torch.randperm(len(x_shard), generator=gen), 0
        idx = perm[pos: pos + args.batch_size].to(device)
        pos += args.batch_size
        loss = F.cross_entropy(ddp(x_shard[idx]), y_shard[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if rank == 0 and (step % args.log_every == 0 or step == args.steps - 1):
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    elapsed = time.perf_counter() - t0

    model.eval()
    with torch.no_grad():
        logits = model(x_test.to(device))
        test_loss = F.cross_entropy(logits, y_test.to(device)).item()
        accuracy = (logits.argmax(1).cpu() == y_test).float().mean().item()
    if rank == 0:
        print(f"final test_loss {test_loss:.6f} accuracy {accuracy:.4f} time {elapsed:.2f}s", flush=True)

    if args.save and ("{rank}" in args.save or rank == 0):
        path = args.save.replace("{rank}", str(rank))
        torch.save({k: v.detach().cpu() for k, v in model.state_dict().items()}, path)
    if args.use_hook:
        state.close()
    # Free DDP before its process group. DDP's C++ reducer holds the group; if it drops the last
    # reference, gloo's destructor joins its worker threads with the GIL held while a worker may
    # need the GIL to free a work object launched in backward (a deadlock seen with torch 2.13).
    # Freed by destroy_process_group() instead, the group is destroyed with the GIL released.
    del ddp, opt
    gc.collect()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
