#!/usr/bin/env python3
"""The relative L2 error of a 16-bit GEMM output rounded once, and when its k-long sums are
split into parts added in the output type (cuBLASLt's in-place split-K reduction), against
the exact product. Inputs uniform in [-1, 1), rounded to the dtype, as tests/gpu draws them.

    python3 tools/gemm_split_rounding.py [m n k]     (default 64 128 96: the GPU test's shape)
"""
import random
import struct
import sys


def round_fp32(x):
    return struct.unpack("f", struct.pack("f", x))[0]


def round_bf16(x):
    bits = struct.unpack("I", struct.pack("f", x))[0]
    bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
    return struct.unpack("f", struct.pack("I", bits & 0xFFFFFFFF))[0]


def round_fp16(x):
    return struct.unpack("e", struct.pack("e", x))[0]


def rel_l2(got, ref):
    num = sum((g - r) ** 2 for g, r in zip(got, ref))
    den = sum(r * r for r in ref)
    return (num / den) ** 0.5


def main():
    m, n, k = (int(v) for v in sys.argv[1:4]) if len(sys.argv) >= 4 else (64, 128, 96)
    rng = random.Random(1)
    for name, rnd in (("bf16", round_bf16), ("fp16", round_fp16)):
        a = [[rnd(rng.uniform(-1, 1)) for _ in range(k)] for _ in range(m)]
        b = [[rnd(rng.uniform(-1, 1)) for _ in range(n)] for _ in range(k)]
        exact, once = [], []
        split = {parts: [] for parts in (2, 3, 4)}
        for i in range(m):
            for j in range(n):
                terms = [a[i][p] * b[p][j] for p in range(k)]  # exact in double
                s = sum(terms)
                exact.append(s)
                once.append(rnd(round_fp32(s)))
                for parts in split:
                    acc = None
                    for q in range(parts):
                        part = round_fp32(sum(terms[q * k // parts:(q + 1) * k // parts]))
                        acc = rnd(part) if acc is None else rnd(round_fp32(acc + part))
                    split[parts].append(acc)
        line = f"{name} {m}x{n}x{k}: rounded once {rel_l2(once, exact):.3g}"
        for parts, got in split.items():
            line += f", {parts} parts added in {name} {rel_l2(got, exact):.3g}"
        print(line)


if __name__ == "__main__":
    main()
