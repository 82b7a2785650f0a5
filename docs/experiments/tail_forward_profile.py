"""Probe: where a grad-enabled forward's device time goes, eager (Model) against ModelNew, kernel
by kernel (torch.profiler, CUDA activity), for one case of small_batch_rule.py's tables.

  PYTHONPATH=python python docs/experiments/tail_forward_profile.py [--case c32_c32_k5] [--batch 2]
      [--strict] [--iters 50]
"""
import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import convpool
from convpool.model import Model

CASES = {
    "c32_c32_k5": ((32, 16, 32, 32), [32, 32, 5, 2.0, 2, (32, 1, 1, 1), 1]),
    "c16_c32_pool3": ((16, 16, 32, 32), [16, 32, 3, 2.0, 3, (32, 1, 1, 1), 1]),
    "c16_c32": ((16, 16, 32, 32), [16, 32, 3, 2.0, 2, (32, 1, 1, 1), 1]),
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="c32_c32_k5", choices=sorted(CASES))
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()
    torch.backends.cudnn.allow_tf32 = not args.strict
    shape, init = CASES[args.case]
    torch.manual_seed(0)
    ref = Model(*init).cuda()
    new = convpool.ModelNew(*init).cuda()
    new.load_state_dict(ref.state_dict())
    x = torch.rand((args.batch,) + shape, device="cuda").requires_grad_(True)
    for name, m in (("eager", ref), ("ModelNew", new)):
        for _ in range(10):
            m(x)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(args.iters):
                m(x)
            torch.cuda.synchronize()
        print(f"## {name}: {args.case} b{args.batch} {'strict' if args.strict else 'TF32'}, "
              f"{args.iters} grad-enabled forwards\n")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=12, max_name_column_width=70))


if __name__ == "__main__":
    main()
