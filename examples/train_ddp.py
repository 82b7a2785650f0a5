"""Data-parallel training of convpool.ModelNew with torch.nn.parallel.DistributedDataParallel.

    torchrun --nproc_per_node 2 examples/train_ddp.py                 # CPU: gloo
    torchrun --nproc_per_node 2 examples/train_ddp.py --device cuda   # one GPU per rank: NCCL

What it shows:
- seeding: every rank builds ModelNew from the same seed, so the replicas start equal (DDP also
  broadcasts rank 0's parameters when it wraps the module);
- sharding: each step draws one global batch from a seed shared by all ranks and each rank
  takes its contiguous slice, so N ranks see exactly what one process would see;
- the loss is the mean over the local slice; DDP averages gradients over ranks, which gives the
  gradient of the mean over the global batch;
- saving: rank 0 writes the module's state_dict (conv.weight, conv.bias, bias), which loads
  into the reference convpool.Model unchanged.

run(rank, world, args) does the work, so tests can start the ranks with
torch.multiprocessing instead of torchrun.
"""
import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
import convpool  # noqa: E402

# A small version of KernelBench L2 #8: Model(in, out, kernel, divisor, pool, bias_shape, sum_dim).
INIT = (4, 8, 3, 2.0, 2, (8, 1, 1, 1), 1)
X_SHAPE = (4, 10, 18, 18)  # (Cin, D, H, W)


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--global-batch", type=int, default=8, help="samples per step over all ranks")
    ap.add_argument("--lr", type=float, default=0.002)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--save", default="convpool_ddp.pt", help="rank 0 saves the state_dict here")
    ap.add_argument("--strict", action="store_true", help="FP32-accurate convolution (TF32 off)")
    return ap.parse_args(argv)


def global_batch(step, args, device):
    """The step's whole batch, identical on every rank: (x, target)."""
    g = torch.Generator().manual_seed(args.seed * 1000003 + step)
    x = torch.rand((args.global_batch,) + X_SHAPE, generator=g)
    target = torch.randn(args.global_batch, 1, 1, 1, generator=g)
    return x.to(device), target.to(device)


def shard(t, rank, world):
    """Rank's contiguous slice of the batch dimension."""
    per = t.shape[0] // world
    return t[rank * per:(rank + 1) * per]


def run(rank, world, args, on_step=None):
    """Trains on this rank; on_step(step, module, loss) is called after each optimizer step.
    Returns the trained (unwrapped) module."""
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank % torch.cuda.device_count())
    device = torch.device("cuda", torch.cuda.current_device()) if cuda else torch.device("cpu")
    torch.backends.cudnn.allow_tf32 = not args.strict  # ModelNew follows this flag

    torch.manual_seed(args.seed)
    model = convpool.ModelNew(*INIT).to(device)
    ddp = DDP(model, device_ids=[device.index] if cuda else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=args.lr)
    if args.global_batch % world:
        raise SystemExit(f"--global-batch {args.global_batch} must divide by the {world} ranks")

    for step in range(args.steps):
        x, target = global_batch(step, args, device)
        x, target = shard(x, rank, world), shard(target, rank, world)
        opt.zero_grad(set_to_none=True)
        loss = ((ddp(x) - target) ** 2).mean()
        loss.backward()  # DDP all-reduces (averages) the gradients here
        opt.step()
        if on_step is not None:
            on_step(step, model, loss)
        if rank == 0:
            print(f"step {step}: loss {loss.item():.6f} (rank 0's shard)", flush=True)
    return model


def main(argv=None):
    args = parse_args(argv)
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend)  # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR/PORT
    rank, world = dist.get_rank(), dist.get_world_size()
    try:
        model = run(rank, world, args)
        if rank == 0:
            torch.save(model.state_dict(), args.save)
            reference = convpool.Model(*INIT)
            reference.load_state_dict(torch.load(args.save))  # same keys as the reference Model
            print(f"saved {args.save}; it loads into convpool.Model", flush=True)
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
