"""ModelNew under DistributedDataParallel (examples/train_ddp.py), 2 ranks: on the CPU with gloo
(always), and on 2 GPUs with NCCL where there are 2 (scripts/device.sh on a 2-GPU kind). One
step's gradients equal a single process's on the whole batch, and after several steps the ranks
hold bit-identical parameters.

Routes: the default route is the fused backward on both devices (strict FP32 on CUDA: codes
written by the strict k3p2 training forward, near-ties rechecked in double); the "fused" case sets CONVPOOL_TORCH_BACKWARD=fused in TF32 (codes
written by the k3p2 training forward), the "dense" case CONVPOOL_TORCH_BACKWARD=dense (PyTorch's
ops, the route of wide channels and 16-bit training)."""
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "examples"))
import train_ddp  # noqa: E402

import convpool  # noqa: E402

pytestmark = pytest.mark.skipif(not (dist.is_available() and dist.is_gloo_available()),
                                reason="torch.distributed with gloo is not available")

WORLD = 2


NEEDS_2_GPUS = pytest.mark.skipif(
    not (torch.cuda.is_available() and torch.cuda.device_count() >= 2 and dist.is_nccl_available()),
    reason="needs 2 GPUs and NCCL")
# (backend, route, precision): route "auto" is the library's own choice, "fused" and "dense"
# force either backward through CONVPOOL_TORCH_BACKWARD (the spawned ranks inherit it).
CASES = [pytest.param("gloo", "auto", "strict", id="cpu-gloo"),
         pytest.param("nccl", "auto", "strict", id="cuda-nccl", marks=NEEDS_2_GPUS),
         pytest.param("nccl", "dense", "strict", id="cuda-nccl-dense-strict", marks=NEEDS_2_GPUS),
         pytest.param("nccl", "fused", "tf32", id="cuda-nccl-fused-tf32", marks=NEEDS_2_GPUS)]


def case_args(backend, route, precision, monkeypatch):
    if route != "auto":
        monkeypatch.setenv("CONVPOOL_TORCH_BACKWARD", route)
    return (["--device", "cuda"] if backend == "nccl" else []) + (["--strict"] if precision == "strict" else [])


def run_ranks(tmp_path, argv, backend):
    from _ddp_worker import worker

    mp.start_processes(worker, args=(WORLD, str(tmp_path / "store"), str(tmp_path), argv, backend),
                       nprocs=WORLD, join=True, start_method="spawn")
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(WORLD)]


def single_process_grads(argv):
    """One step of the same training on the whole global batch, in one process."""
    args = train_ddp.parse_args(argv)
    device = torch.device("cuda", 0) if args.device == "cuda" else torch.device("cpu")
    saved = torch.backends.cudnn.allow_tf32
    torch.backends.cudnn.allow_tf32 = not args.strict
    try:
        torch.manual_seed(args.seed)
        model = convpool.ModelNew(*train_ddp.INIT).to(device)
        x, target = train_ddp.global_batch(0, args, device)
        loss = ((model(x) - target) ** 2).mean()
        loss.backward()
    finally:
        torch.backends.cudnn.allow_tf32 = saved
    return {n: p.grad.detach().cpu().clone() for n, p in model.named_parameters()}


def check_route(ranks, backend, route):
    """The ranks took the backward the case meant: PyTorch's ops where forced, else convpool's
    fused one (the default on both devices)."""
    want = route != "dense"
    for r, rec in enumerate(ranks):
        assert rec["fused_backward"] is want, f"rank {r}: fused backward {rec['fused_backward']}, wanted {want}"


@pytest.mark.parametrize("backend,route,precision", CASES)
def test_one_step_matches_single_process(tmp_path, monkeypatch, backend, route, precision):
    argv = ["--steps", "1", "--global-batch", "8", "--seed", "3"] + case_args(backend, route, precision, monkeypatch)
    ranks = run_ranks(tmp_path, argv, backend)
    check_route(ranks, backend, route)
    want = single_process_grads(argv)
    for r, rec in enumerate(ranks):
        got = rec[0]["grads"]
        assert set(got) == set(want) == {"conv.weight", "conv.bias", "bias"}
        for name in want:
            # Each rank's gradient is a float32 sum over its half of the batch; the all-reduce
            # adds the halves and the single process sums all in one go: the orders differ, so
            # allow float32 rounding relative to the gradient's scale. In TF32 too: both runs
            # convolve each sample with the same kernel, so the conv values (and the arg-max
            # codes the gradient follows) are the same; only the sums' order differs.
            scale = want[name].abs().max().item() + 1e-30
            err = (got[name] - want[name]).abs().max().item()
            assert err <= 1e-5 * scale, f"rank {r} {name}: max |DDP - single| {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("backend,route,precision", CASES)
def test_ranks_stay_identical(tmp_path, monkeypatch, backend, route, precision):
    argv = ["--steps", "4", "--global-batch", "8", "--seed", "5"] + case_args(backend, route, precision, monkeypatch)
    ranks = run_ranks(tmp_path, argv, backend)
    check_route(ranks, backend, route)
    for step in range(4):
        p0, p1 = ranks[0][step]["params"], ranks[1][step]["params"]
        for name in p0:
            assert torch.equal(p0[name], p1[name]), f"step {step}: {name} differs between the ranks"
        # The ranks train on different halves, so their losses differ while the parameters agree.
        assert not torch.equal(ranks[0][step]["loss"], ranks[1][step]["loss"])


def test_saved_state_dict_loads_into_model(tmp_path):
    args = train_ddp.parse_args([])
    torch.manual_seed(args.seed)
    model = convpool.ModelNew(*train_ddp.INIT)
    path = tmp_path / "m.pt"
    torch.save(model.state_dict(), path)
    ref = convpool.Model(*train_ddp.INIT)
    ref.load_state_dict(torch.load(path))
    x = torch.rand((2,) + train_ddp.X_SHAPE)
    with torch.no_grad():
        torch.testing.assert_close(model(x), ref(x), rtol=1e-5, atol=1e-5)
