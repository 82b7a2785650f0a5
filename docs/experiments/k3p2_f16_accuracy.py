"""Experiment: the error of k3p2's float16-operand forward at the headline's size, against
float64, beside eager TF32's and the TF32 instance's.

The pytest cases force the float16 instance on small shapes (CONVPOOL_K3P2_F16=1); this checks
the sizes where the plan picks it by itself (from 2^21 x positions: batch 32 up). For each
batch: relative Frobenius errors of the output and of every gradient (x, conv weight, conv bias,
bias) of a loss that weighs the outputs unevenly, against float64 autograd on the same x and
parameters, for PyTorch eager in TF32 and convpool with the float16 instance (default) and the
TF32 instance alone (CONVPOOL_K3P2_F16=0). The issue's rule: within twice eager's error.

  PYTHONPATH=python python3 docs/experiments/k3p2_f16_accuracy.py [batch ...]
"""
import copy
import os
import sys

import torch

import convpool

torch.backends.cudnn.allow_tf32 = True
INIT = [8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1]


def grads(model, x):
    xi = x.clone().requires_grad_(True)
    y = model(xi)
    loss = (y * torch.linspace(0.5, 1.5, y.numel(), device=y.device, dtype=y.dtype).view(y.shape)).sum()
    params = dict(model.named_parameters())
    return [y.detach()] + list(torch.autograd.grad(loss, [xi] + [params[n] for n in NAMES]))


def rel(a, t):
    return ((a.double() - t).norm() / t.norm()).item()


NAMES = [n for n, _ in convpool.Model(*INIT).named_parameters()]  # bias, conv.weight, conv.bias
print("| batch | run | out | grad x | " + " | ".join(f"grad {n}" for n in NAMES) + " |")
print("|---|---|---|---|" + "---|" * len(NAMES))
for batch in [int(a) for a in sys.argv[1:]] or [32, 128]:
    torch.manual_seed(batch)
    ref = convpool.Model(*INIT).cuda()
    torch.manual_seed(batch)
    new = convpool.ModelNew(*INIT).cuda()
    x = torch.rand(batch, 8, 16, 64, 64, device="cuda")
    truth = grads(copy.deepcopy(ref).double(), x.double())
    rows = {"eager TF32": grads(ref, x)}
    for name, env in (("convpool float16 (default)", None), ("convpool TF32 instance", "0")):
        if env is None:
            os.environ.pop("CONVPOOL_K3P2_F16", None)
        else:
            os.environ["CONVPOOL_K3P2_F16"] = env
        rows[name] = grads(new, x)
    os.environ.pop("CONVPOOL_K3P2_F16", None)
    for name, got in rows.items():
        print(f"| {batch} | {name} | " + " | ".join(f"{rel(g, t):.2e}" for g, t in zip(got, truth)) + " |")
    del truth, rows
    torch.cuda.empty_cache()
