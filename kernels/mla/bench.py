"""MLA benchmarks (H200, bf16) and the cache-size table (computed, no GPU needed).

    >>> df = decode_benchmark()          # times on a GPU, loads results/mla_decode.csv elsewhere
    >>> cache_bytes_table()              # bytes per token: MLA vs GQA vs MHA
"""
from __future__ import annotations

import pandas as pd
import torch

from ..bench import in_fresh_process, run_or_load, time_graph_ms, time_ms
from .decode import mla_decode
from .reference import yarn_softmax_scale

H, D_C, D_R, D_NOPE, D_V = 128, 512, 64, 128, 128  # DeepSeek-V3 attention
D_QK = D_C + D_R                                    # 576: the kernel's key width
SCALE = yarn_softmax_scale()

# FlashMLA's own benchmark shapes (B=128, s_q=1, 4K..32K) and the article's (B = 1, 8, 32 at 4K..16K),
# plus B=64 so latency against batch has a point between.
DECODE_CASES = ([{"B": 128, "T": t} for t in (4096, 8192, 16384, 32768)]
                + [{"B": b, "T": t} for b in (1, 8, 32, 64) for t in (4096, 8192, 16384)])


def cache_bytes_table() -> pd.DataFrame:
    """KV-cache bytes per token in bf16: per layer and for the whole model.

    DeepSeek-V3 MLA: 512 latent + 64 RoPE values, shared by all 128 heads, 61 layers.
    The same model with plain MHA would cache K (192) and V (128) for 128 heads.
    LLaMA-3-70B: GQA with 8 KV heads of 128 (K and V), 80 layers; its MHA would have 64 heads.
    """
    rows = [
        ("DeepSeek-V3, MLA (latent 512 + RoPE 64)", 61, D_C + D_R),
        ("DeepSeek-V3 dims, MHA (128 heads x (192 + 128))", 61, H * (192 + 128)),
        ("LLaMA-3-70B, GQA (8 KV heads x 2 x 128)", 80, 8 * 2 * 128),
        ("LLaMA-3-70B dims, MHA (64 heads x 2 x 128)", 80, 64 * 2 * 128),
    ]
    df = pd.DataFrame(rows, columns=["cache", "layers", "values_per_token_per_layer"])
    df["KB_per_token_per_layer"] = df["values_per_token_per_layer"] * 2 / 1024
    df["KB_per_token_model"] = df["KB_per_token_per_layer"] * df["layers"]
    df["GB_at_128K_tokens"] = df["KB_per_token_model"] * 1024 * 131072 / 1e9
    return df


def plot_cache_bytes(df: pd.DataFrame):
    """Horizontal bars: KB per token for the whole model (bf16), log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7.5, 2.8))
    colors = ["#1f5fbf" if "MLA" in c else "#9e9e9e" for c in df["cache"]]
    ax.barh(df["cache"], df["KB_per_token_model"], color=colors)
    for y, v in enumerate(df["KB_per_token_model"]):
        ax.text(v * 1.05, y, f"{v:,.0f} KB", va="center", fontsize=9)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("KV cache per token, whole model, bf16 (KB, log scale)")
    ax.set_title("What one token costs in the cache", fontsize=11)
    fig.tight_layout()
    plt.close(fig)  # shown once, as the cell's value
    return fig


def decode_flops(case) -> float:
    """2 * B * H * s_q * T * (576 + 512): the score and the value product, absorbed form."""
    return 2.0 * case["B"] * H * case.get("s_q", 1) * case["T"] * (D_QK + D_C)


def decode_bytes(case) -> float:
    """The latent cache read once, plus q (576 wide) and out (512 wide), bf16."""
    B, T, s_q = case["B"], case["T"], case.get("s_q", 1)
    return 2.0 * (B * T * D_QK + B * s_q * H * (D_QK + D_C))


def _inputs(case, dtype=torch.bfloat16):
    B, T = case["B"], case["T"]
    q = torch.randn(B, 1, H, D_QK, device="cuda", dtype=dtype)
    kv = torch.randn(B, T, D_QK, device="cuda", dtype=dtype)
    seqlens = torch.full((B,), T, device="cuda", dtype=torch.int32)
    return q, kv, seqlens


def _book(case, num_splits=None, backend="auto"):
    q, kv, seqlens = _inputs(case)
    # check_seqlens=False: the check is one device sync, which a serving loop (and a graph) leaves out.
    return lambda: mla_decode(q, kv, seqlens, SCALE, num_splits=num_splits, check_seqlens=False, backend=backend)


def _torch_absorbed(case):
    """The attention part of `mla_absorbed`, in the fastest plain-PyTorch form measured on the H200: two
    batched matmuls over the 576-wide cache with the scale folded into q, and a bf16 softmax (computed in
    fp32 inside the kernel). Upcasting the scores to fp32 first made it 1.6x slower (1.91 against 1.19 ms
    at B=128, T=8K), and splitting latent and RoPE parts as `mla_absorbed` does, 1.3x."""
    q, kv, _ = _inputs(case)
    B = case["B"]

    def run():
        s = torch.bmm(q.view(B, H, D_QK) * SCALE, kv.transpose(1, 2))      # [B, H, T]
        return torch.bmm(torch.softmax(s, dim=-1), kv[..., :D_C]).view(B, 1, H, D_C)
    return run


def _torch_naive(case):
    """Rebuild K and V per head from c_kv, then SDPA; only while the rebuilt K/V fit comfortably."""
    B, T = case["B"], case["T"]
    if B * T > 131072:  # K and V for 128 heads would be > 10 GB
        return None
    import torch.nn.functional as F

    dt = torch.bfloat16
    c_kv = torch.randn(B, T, D_C, device="cuda", dtype=dt)
    k_pe = torch.randn(B, T, D_R, device="cuda", dtype=dt)
    q = torch.randn(B, H, 1, D_NOPE + D_R, device="cuda", dtype=dt)
    W_uk = torch.randn(H * D_NOPE, D_C, device="cuda", dtype=dt) * D_C ** -0.5
    W_uv = torch.randn(H * D_V, D_C, device="cuda", dtype=dt) * D_C ** -0.5

    def run():
        k_nope = (c_kv @ W_uk.T).view(B, T, H, D_NOPE).transpose(1, 2)
        v = (c_kv @ W_uv.T).view(B, T, H, D_V).transpose(1, 2)
        k = torch.cat([k_nope, k_pe[:, None].expand(B, H, T, D_R)], dim=-1)
        return F.scaled_dot_product_attention(q, k, v, scale=SCALE)
    return run


DECODE_PROVIDERS = {
    "book": _book,                                                      # Gluon where it applies, else Triton
    "book: Triton": lambda case: _book(case, backend="triton"),         # the Triton kernel everywhere
    "book: no split": lambda case: _book(case, num_splits=1, backend="triton"),  # ... in a single pass
    "PyTorch absorbed": _torch_absorbed,
    "PyTorch naive": _torch_naive,
}


@in_fresh_process
def decode_benchmark() -> pd.DataFrame:
    """MLA decode, H=128, s_q=1, bf16, each call replayed from a CUDA graph (launch overhead removed)."""
    return run_or_load("mla_decode", DECODE_CASES, DECODE_PROVIDERS, decode_flops, decode_bytes,
                       timer=time_graph_ms)


PLAIN_CASES = [{"B": 1, "T": 4096}, {"B": 1, "T": 16384}, {"B": 128, "T": 8192}]


@in_fresh_process
def plain_call_benchmark() -> pd.DataFrame:
    """The same kernels timed as plain Python calls (launch overhead included)."""
    providers = {k: DECODE_PROVIDERS[k] for k in ("book", "book: Triton", "book: no split", "PyTorch absorbed")}
    return run_or_load("mla_decode_plain", PLAIN_CASES, providers, decode_flops, decode_bytes, timer=time_ms)


def summary(df: pd.DataFrame) -> pd.DataFrame:
    """ms per provider (columns) per shape (rows), with the speed-up of 'book' over PyTorch absorbed and over
    the Triton kernel, and of split-KV over a single pass (both Triton)."""
    t = df.pivot_table(index=["B", "T"], columns="provider", values="ms")
    if "book" in t and "PyTorch absorbed" in t:
        t["book speed-up vs PyTorch absorbed"] = t["PyTorch absorbed"] / t["book"]
    if "book" in t and "book: Triton" in t:
        t["book speed-up vs book: Triton"] = t["book: Triton"] / t["book"]
    if "book: Triton" in t and "book: no split" in t:
        t["split-KV speed-up"] = t["book: no split"] / t["book: Triton"]
    pct = df[df["provider"] == "book"].set_index(["B", "T"])["pct_roofline"]
    t["book % of roofline"] = pct
    return t.round(3)


if __name__ == "__main__":  # python -m kernels.mla.bench: run both sweeps, print the summary
    import sys

    from ..bench import provenance

    d = decode_benchmark()
    print(provenance(d))
    with pd.option_context("display.width", 200, "display.max_columns", 20):
        print(summary(d))
        print(summary(plain_call_benchmark()))
    from .decode import _mla_decode_tuned
    print("autotuned configs:", {k: str(v) for k, v in _mla_decode_tuned.cache.items()}, file=sys.stderr)
