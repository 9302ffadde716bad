"""PyTorch's times for the attention shapes zeroplan's bench_kernels_cuda times, on the same GPU.

torch.nn.functional.scaled_dot_product_attention (whichever fused backend PyTorch picks; the
kernel that took the most GPU time in each direction is printed, from torch.profiler: on
Hopper with torch 2.11 the DeepSpeed reference runs' profiles name cuDNN's
cudnn_generated_fort_native_sdpa_sm90_flash_*_wgmma kernels, not flash-attention 2), forward
and backward, CUDA events, median of 20 after 3 warm-up calls. The FLOP counts are bench_kernels_cuda's (causal: T(T+1)/2 pairs;
backward 2.5 forward products). Prints one line per shape and direction.

    python3 bench/torch_sdpa_probe.py
"""
import torch
import torch.nn.functional as F

from torch_gemm_probe import timed

SHAPES = (  # name, B, H, T, D, causal, dropout
    ("gpt2 causal", 16, 12, 1024, 64, True, 0.0),
    ("gpt2 causal dropout 0.1", 16, 12, 1024, 64, True, 0.1),
    ("gpt2-medium causal", 16, 16, 1024, 64, True, 0.0),
    ("llama causal D=128", 4, 32, 2048, 128, True, 0.0),
)


def main():
    torch.manual_seed(0)
    for dt in (torch.bfloat16, torch.float16):
        for name, b, h, t, d, causal, p in SHAPES:
            q, k, v = (torch.randn(b, h, t, d, device="cuda", dtype=dt, requires_grad=True) for _ in range(3))
            dout = torch.randn(b, h, t, d, device="cuda", dtype=dt)
            pairs = t * (t + 1) / 2 if causal else t * t
            fwd_flop = 4.0 * b * h * pairs * d

            def fwd():
                return F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=causal)

            out = fwd()
            ms_f = timed(fwd)
            ms_b = timed(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))
            dts = str(dt).replace("torch.", "").replace("bfloat16", "bf16").replace("float16", "fp16")
            print(f"torch sdpa fwd {dts} {name:26s} {ms_f:8.3f} ms {fwd_flop / ms_f / 1e9:7.1f} TFLOP/s", flush=True)
            print(f"torch sdpa bwd {dts} {name:26s} {ms_b:8.3f} ms {2.5 * fwd_flop / ms_b / 1e9:7.1f} TFLOP/s",
                  flush=True)
            print(f"torch sdpa kernels {dts} {name:22s} fwd {top_kernel(fwd)}; bwd "
                  f"{top_kernel(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True))}", flush=True)


def top_kernel(f):
    """The name of the GPU kernel that took the most time in one call of f (torch.profiler)."""
    from torch.profiler import ProfilerActivity, profile
    try:
        f()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            f()
            torch.cuda.synchronize()
        times = {}
        for e in prof.events():
            if e.device_type == torch.autograd.DeviceType.CUDA:
                times[e.name] = times.get(e.name, 0.0) + e.device_time_total
        return max(times, key=times.get)[:90] if times else "none recorded"
    except Exception as err:  # an older or newer profiler API: the times above still stand
        return f"unknown ({type(err).__name__}: {err})"[:90]


if __name__ == "__main__":
    main()
