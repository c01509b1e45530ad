"""MLA benchmarks (H200, bf16), declared for the shared harness, and the cache-size table (computed, no GPU).

    >>> from attention_kernels.bench import run
    >>> df = run(DECODE)                 # times on a GPU, loads results/mla_decode.csv elsewhere
    >>> cache_bytes_table()              # bytes per token: MLA vs GQA vs MHA
"""
from __future__ import annotations

import pandas as pd
import torch

from ..bench import Benchmark, Panel
from ..peers import flashmla, tilelang
from ..plot import BOOK_COLOR, COLUMN_INCHES, styled
from .interface import mla_decode, mla_decode_tilelang
from .reference import yarn_softmax_scale

OTHER_COLOR = "#8c8c8c"  # the caches MLA is compared with

H, D_C, D_R, D_NOPE, D_V = 128, 512, 64, 128, 128  # DeepSeek-V3 attention
D_QK = D_C + D_R                                    # 576: the kernel's key width
SCALE = yarn_softmax_scale()


VALUES, KB_LAYER = "values per token, one layer", "KB per token, one layer"
KB_MODEL, GB_128K = "KB per token, whole model", "GB at 128K tokens"


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
    df = pd.DataFrame(rows, columns=["cache", "layers", VALUES])
    df[KB_LAYER] = df[VALUES] * 2 / 1024
    df[KB_MODEL] = df[KB_LAYER] * df["layers"]
    df[GB_128K] = df[KB_MODEL] * 1024 * 131072 / 1e9
    return df


@styled
def plot_cache_bytes(df: pd.DataFrame):
    """Horizontal bars: KB per token for the whole model (bf16), log scale."""
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 2.8))
    colors = [BOOK_COLOR if "MLA" in c else OTHER_COLOR for c in df["cache"]]
    ax.barh(df["cache"], df[KB_MODEL], color=colors)
    for y, v in enumerate(df[KB_MODEL]):
        ax.text(v * 1.05, y, f"{v:,.0f} KB", va="center", fontsize=9)
    ax.set_xscale("log")
    ax.invert_yaxis()
    ax.set_xlabel("KV cache per token, whole model, bf16 (KB, log scale)")
    ax.set_title("What one token costs in the cache", fontsize=11)
    plt.close(fig)  # shown once, as the cell's value
    return fig


# ---------------------------------------------------------------------------------- decode, one query token
def decode_flops(case) -> float:
    """2 * B * H * T * (576 + 512): the score and the value product, absorbed form, one query token."""
    return 2.0 * case["B"] * case["H"] * case["T"] * (case["D"] + D_C)


def decode_bytes(case) -> float:
    """The latent cache read once, plus q (576 wide) and out (512 wide), bf16."""
    B, T, H, D = case["B"], case["T"], case["H"], case["D"]
    return 2.0 * (B * T * D + B * H * (D + D_C))


def _inputs(case):
    B, T, H, D = case["B"], case["T"], case["H"], case["D"]
    q = torch.randn(B, 1, H, D, device="cuda", dtype=torch.bfloat16)
    kv = torch.randn(B, T, D, device="cuda", dtype=torch.bfloat16)
    seqlens = torch.full((B,), T, device="cuda", dtype=torch.int32)
    return q, kv, seqlens


def _book(case, num_splits=None, backend="auto"):
    q, kv, seqlens = _inputs(case)
    # check_seqlens=False: the check is one device sync, which a serving loop (and a graph) leaves out.
    return lambda: mla_decode(q, kv, None, seqlens, D_C, SCALE, num_splits=num_splits, check_seqlens=False,
                              backend=backend)


def _torch_absorbed(case):
    """The attention part of `mla_absorbed`, in the fastest plain-PyTorch form measured on the H200: two
    batched matmuls over the 576-wide cache with the scale folded into q, and a bf16 softmax (computed in
    fp32 inside the kernel). Upcasting the scores to fp32 first made it 1.6x slower (1.91 against 1.19 ms
    at B=128, T=8K), and splitting latent and RoPE parts as `mla_absorbed` does, 1.3x."""
    q, kv, _ = _inputs(case)
    B, H, D = case["B"], case["H"], case["D"]

    def run():
        s = torch.bmm(q.view(B, H, D) * SCALE, kv.transpose(1, 2))      # [B, H, T]
        return torch.bmm(torch.softmax(s, dim=-1), kv[..., :D_C]).view(B, 1, H, D_C)
    return run


def _torch_naive(case):
    """Rebuild K and V per head from c_kv, then SDPA; only while the rebuilt K/V fit comfortably."""
    B, T, H = case["B"], case["T"], case["H"]
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


def _case(B, T):
    return {"B": B, "T": T, "H": H, "D": D_QK}


# FlashMLA's own benchmark shapes (B=128, s_q=1, 4K..32K) and the article's (B = 1, 8, 32 at 4K..16K),
# plus B=64 so latency against batch has a point between.
DECODE = Benchmark(
    "mla_decode",
    [_case(128, t) for t in (4096, 8192, 16384, 32768)]
    + [_case(b, t) for b in (1, 8, 32, 64) for t in (4096, 8192, 16384)],
    DECODE_PROVIDERS, decode_flops, decode_bytes, timer="graph",  # replayed from a CUDA graph: no launch overhead
    module=__name__)
DECODE_PLAIN = Benchmark(  # the same kernels called from Python, back to back as a decode loop calls them
    "mla_decode_plain",
    [_case(1, 4096), _case(1, 16384), _case(128, 8192)],
    {k: DECODE_PROVIDERS[k] for k in ("book", "book: Triton", "book: no split", "PyTorch absorbed")},
    decode_flops, decode_bytes, timer="plain", module=__name__)


# ---------------------------------------------------------------------------------- decode on a paged cache
# FlashMLA's serving layout: pages of 64 positions, kv_cache [num_blocks, 64, 1, 576], an int32 block table.
# Every provider reads the same numbers (one seed per case). "in order": sequence b's pages are blocks
# b * T/64 ... in order, which is the dense [B, T, 576] cache's own memory, so the dense kernel reads that
# very tensor; "shuffled": the same pages at random places, as a serving engine's allocator leaves them.
# The shared harness replays each call from a CUDA graph and times it with triton's do_bench, which zeroes a
# 256 MB buffer before every replay: the L2 cache is flushed, every call reads its cache from HBM.
PAGE = 64


def _paged_inputs(case, device="cuda", dtype=torch.bfloat16):
    """q [B, 1, H, D], the dense cache [B, T, D] (None when shuffled), its pages [num_blocks, 64, D] in the
    case's order, the block table int32 [B, T / 64] and the lengths (all T). In order, the pages are a view
    of the dense cache. T must be a multiple of 64."""
    B, T, H, D = case["B"], case["T"], case["H"], case["D"]
    torch.manual_seed(0)
    q = torch.randn(B, 1, H, D, device=device, dtype=dtype)
    kv = torch.randn(B, T, D, device=device, dtype=dtype)
    seqlens = torch.full((B,), T, device=device, dtype=torch.int32)
    n_blocks = B * T // PAGE
    pages = kv.view(n_blocks, PAGE, D)
    if case["pages"] == "in order":
        table = torch.arange(n_blocks, device=device, dtype=torch.int32).view(B, T // PAGE)
    else:
        (pages, table), kv = shuffled_pages(pages, B), None   # (the dense copy is freed: only the pages are read)
    return q, kv, pages, table, seqlens


def shuffled_pages(pages, B):
    """pages [n_blocks, PAGE, D], B sequences' pages one after another, moved to random blocks, as a serving
    engine's allocator leaves them, and the block table int32 [B, n_blocks / B] that finds them: page j of
    sequence b lives in block table[b, j]."""
    perm = torch.randperm(pages.shape[0], device=pages.device)
    shuffled = torch.empty_like(pages)
    shuffled[perm] = pages
    return shuffled, perm.to(torch.int32).view(B, -1)


def _book_paged(case, backend="auto"):
    q, _, pages, table, seqlens = _paged_inputs(case)
    return lambda: mla_decode(q, pages, table, seqlens, D_C, SCALE, check_seqlens=False, backend=backend)


def _book_dense_same_memory(case):
    """The Gluon kernel on the dense cache whose memory the in-order pages are (no shuffled counterpart)."""
    if case["pages"] != "in order":
        return None
    q, kv, _, _, seqlens = _paged_inputs(case)
    return lambda: mla_decode(q, kv, None, seqlens, D_C, SCALE, check_seqlens=False)


def _flashmla_paged(case):
    """FlashMLA's decode on the same pages, as [num_blocks, 64, 1, 576]. Its schedule is made here, by one
    plain call on the current stream, and reused by every timed call, as FlashMLA's own benchmark does. (Made
    instead inside the harness's warm-up for a graph, on a side stream, the sweep's replays came out faster
    than the GPU's ceiling at B >= 64; made this way, `scripts/mla_replay_check.py` found replays that give
    the plain call's output in the plain call's time.)"""
    run, get_metadata = flashmla("flash_mla_with_kvcache"), flashmla("get_mla_metadata")
    if run is None or get_metadata is None:
        return None
    q, _, pages, table, seqlens = _paged_inputs(case)
    kcache = pages.unsqueeze(2)
    sched, _ = get_metadata()

    def call():
        return run(q, kcache, table, seqlens, D_C, sched, None, softmax_scale=SCALE, causal=False)
    call()
    torch.cuda.synchronize()
    return call


# On the H200 the sweep never got past the TileLang kernel at B = 128, T = 16K (a 2.4 GB cache), twice, while
# a plain call of it at that size finished in 2 s and gave finite outputs; caches this large are left out of
# its rows until `scripts/mla_replay_check.py` says why.
_TILELANG_SWEEP_BYTES = 2 ** 31


def _tilelang_paged(case, num_splits=None):
    """The book's TileLang kernels (`tilelang_decode.py`) on the same pages; n/a where TileLang is not installed
    and for caches of 2**31 bytes or more (see above). The first call compiles them (a few seconds, in the
    harness's warm-up)."""
    if tilelang() is None or case["B"] * case["T"] * case["D"] * 2 >= _TILELANG_SWEEP_BYTES:
        return None
    q, _, pages, table, seqlens = _paged_inputs(case)
    return lambda: mla_decode_tilelang(q, pages, table, seqlens, D_C, SCALE, num_splits=num_splits,
                                       check_seqlens=False)


PAGED_PROVIDERS = {
    "book": _book_paged,                                               # the Gluon kernel, pages of 64
    "book: dense cache": _book_dense_same_memory,                      # the Gluon kernel on [B, T, 576]
    "book: Triton": lambda case: _book_paged(case, backend="triton"),  # the Triton kernel on the same pages
    "book: TileLang": _tilelang_paged,                                 # split-KV where it pays, as "book"
    "book: TileLang, no split": lambda case: _tilelang_paged(case, num_splits=1),  # the single pass
    "FlashMLA": _flashmla_paged,
}


def _paged_case(B, T, pages):
    return {"B": B, "T": T, "H": H, "D": D_QK, "pages": pages}


_PAGED_SHAPES = [(b, 8192) for b in (1, 8, 32, 64)] + [(128, t) for t in (4096, 8192, 16384, 32768)]
DECODE_PAGED = Benchmark(
    "mla_decode_paged",
    [_paged_case(b, t, order) for order in ("in order", "shuffled") for b, t in _PAGED_SHAPES],
    PAGED_PROVIDERS, decode_flops, decode_bytes, timer="graph", module=__name__)
DECODE_PAGED_PLAIN = Benchmark(  # called from Python, back to back: what a step costs on the host as well
    "mla_decode_paged_plain",
    [_paged_case(1, 8192, "shuffled"), _paged_case(1, 16384, "shuffled"), _paged_case(8, 8192, "shuffled"),
     _paged_case(128, 8192, "shuffled")],
    {k: PAGED_PROVIDERS[k] for k in ("book", "book: Triton", "FlashMLA")}, decode_flops, decode_bytes,
    timer="plain", module=__name__)
BENCHMARKS = [DECODE, DECODE_PLAIN, DECODE_PAGED, DECODE_PAGED_PLAIN]
# Against the strongest peer, on the layout it takes: FlashMLA on shuffled pages.
HEADLINE = Panel("mla_decode_paged", {"B": 128, "pages": "shuffled"}, "T", "tflops", ("book", "FlashMLA"),
                 "MLA decode, paged cache (pages of 64)\nB=128, H=128, one query token", xlabel="context length T")

__all__ = ["DECODE", "DECODE_PLAIN", "DECODE_PAGED", "DECODE_PAGED_PLAIN", "BENCHMARKS", "HEADLINE",
           "cache_bytes_table", "plot_cache_bytes", "decode_flops", "decode_bytes"]
