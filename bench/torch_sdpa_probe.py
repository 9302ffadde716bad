"""PyTorch's times for the attention shapes zeroplan's bench_kernels_cuda times, on the same GPU.

torch.nn.functional.scaled_dot_product_attention (whichever fused backend PyTorch picks:
flash-attention 2 for these shapes), forward and forward + backward, CUDA events, median of
20 after 3 warm-up calls. The FLOP counts are bench_kernels_cuda's (causal: T(T+1)/2 pairs;
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


if __name__ == "__main__":
    main()
