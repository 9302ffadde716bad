"""PyTorch's times for the products zeroplan's bench_kernels_cuda times, on the same GPU.

The GPT-2 LM head with its odd vocabulary (50257) and padded to 50304, forward and both
backward products, bf16, CUDA events, median of 20 after 3 warm-up calls. Prints one line
per product: name, shape, ms, TFLOP/s.

    python3 bench/torch_gemm_probe.py
"""
import torch


def timed(fn, reps=20, warm=3):
    for _ in range(warm):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def main():
    torch.manual_seed(0)
    dev, dt = "cuda", torch.bfloat16
    m, k = 16 * 1024, 768
    for v in (50257, 50304):
        x = torch.randn(m, k, device=dev, dtype=dt)
        w = torch.randn(v, k, device=dev, dtype=dt) * 0.02
        dy = torch.randn(m, v, device=dev, dtype=dt)
        flop = 2.0 * m * v * k
        for name, fn in (("fwd x.w^T", lambda: torch.nn.functional.linear(x, w)),
                         ("bwd dx = dy.w", lambda: dy @ w),
                         ("bwd dw = dy^T.x", lambda: dy.t() @ x)):
            ms = timed(fn)
            print(f"torch lm_head V={v} {name:18s} {m}x{v}x{k} {ms:8.3f} ms {flop / ms / 1e9:7.1f} TFLOP/s", flush=True)
        logits = torch.randn(m, v, device=dev, dtype=dt)
        target = torch.randint(0, 50257, (m,), device=dev)
        ms = timed(lambda: torch.nn.functional.cross_entropy(logits.float(), target))
        print(f"torch cross_entropy(logits.float()) V={v} {ms:8.3f} ms", flush=True)


if __name__ == "__main__":
    main()
