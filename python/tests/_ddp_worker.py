"""A rank of examples/train_ddp.py started by test_ddp.py through torch.multiprocessing (file
rendezvous; gloo on the CPU, NCCL on GPUs): records each step's averaged gradients and
parameters to out_dir, on the CPU."""
import os
import sys

import torch
import torch.distributed as dist

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")
sys.path.insert(0, EXAMPLES)
import train_ddp  # noqa: E402


def worker(rank, world, store, out_dir, argv, backend):
    torch.set_num_threads(1)
    dist.init_process_group(backend, init_method=f"file://{store}", rank=rank, world_size=world)
    try:
        args = train_ddp.parse_args(argv)
        record = {}

        def on_step(step, model, loss):
            record[step] = {
                "grads": {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()},
                "params": {n: p.detach().cpu().clone() for n, p in model.named_parameters()},
                "loss": loss.detach().cpu().clone(),
            }

        model = train_ddp.run(rank, world, args, on_step)
        # Which backward the steps took: convpool's fused one, or PyTorch's ops (the test checks
        # that a case forcing the fused route got it).
        from convpool._ops import _fused_backward_serves, _triple
        x, _ = train_ddp.global_batch(0, args, next(model.parameters()).device)
        x = train_ddp.shard(x, rank, world)
        record["fused_backward"] = _fused_backward_serves(x, model.conv.weight, model.conv.bias, float(model.divisor),
                                                          _triple(model.pool_size, "pool_size"))
        torch.save(record, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
