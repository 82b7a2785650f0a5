"""Probe: where a small batch's grad-enabled forward (ModelNew's conv-tail route) spends its time
against eager's. Synced medians (CUDA events, a sync after each call), then the device kernels
of one call each (torch.profiler) and the host time to enqueue a call.

  PYTHONPATH=python python docs/experiments/small_batch_grad_forward.py
"""
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

import convpool
from convpool.model import Model

CASES = [("headline_bf16 b2", (2, 8, 16, 64, 64), [8, 16, 3, 2.0, 2, (16, 1, 1, 1), 1], torch.bfloat16),
         ("c16_c32 b2", (2, 16, 16, 32, 32), [16, 32, 3, 2.0, 2, (32, 1, 1, 1), 1], torch.float32)]


def main():
    convpool.load()
    for name, shape, init, dt in CASES:
        torch.manual_seed(0)
        ref = Model(*init).cuda().to(dt)
        new = convpool.ModelNew(*init).cuda().to(dt)
        new.load_state_dict(ref.state_dict())
        x = torch.rand(shape, device="cuda", dtype=dt)
        print(f"## {name}")
        for label, m in (("eager", ref), ("convpool", new)):
            for _ in range(5):
                m(x)
            ts, hs = [], []
            for _ in range(50):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                a.record()
                t0 = time.perf_counter()
                m(x)
                hs.append((time.perf_counter() - t0) * 1e6)
                b.record()
                b.synchronize()
                ts.append(a.elapsed_time(b))
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                m(x)
                torch.cuda.synchronize()
            ks = sorted(((e.self_device_time_total, e.key) for e in prof.key_averages()
                         if e.self_device_time_total > 0), reverse=True)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                for _ in range(20):
                    m(x)
                torch.cuda.synchronize()
            rows = sorted(((e.self_cpu_time_total / 20, e.cpu_time_total / 20, e.key) for e in prof.key_averages()),
                          reverse=True)[:12]
            print(f"{label} host ops (self us, total us a call): " +
                  "; ".join(f"{a:.1f}/{b:.1f} {k[:48]}" for a, b, k in rows))
            print(f"{label}: {statistics.median(ts):.4f} ms synced, host {statistics.median(hs):.1f} us, "
                  f"device {sum(k[0] for k in ks) / 1e3:.4f} ms: " +
                  "; ".join(f"{t / 1e3:.4f} {k[:60]}" for t, k in ks[:6]))


if __name__ == "__main__":
    main()
