"""The FlashAttention-2 chapter's benchmarks (H200, bf16, do_bench medians): declarations that
`attention_kernels.bench.run` times on a GPU and loads elsewhere.

    FORWARD   forward, B=1, H=32, D=128, T = 1K..32K, causal and not
    BACKWARD  the backward alone (dq, dk, dv from a saved forward), same shapes
    FA3       the FlashAttention-3 paper's shapes: B·T = 16K tokens, H = 16, D = 128; fwd and bwd
    MEMORY    peak GPU memory of one non-causal forward, T = 1K..64K
    VARLEN    16K tokens of packed sequences of long-tailed lengths (`packed_lengths`), H = 16, D = 128:
              the packed call against the same sequences padded to the longest; fwd and fwd+bwd
    GQA       MHA (32 query heads, 32 KV heads) against GQA (32/8) and MQA (32/1), B=1, D=128,
              T = 4K and 16K, fwd and bwd, causal and not: what sharing K and V costs the backward
    DECODE    one query token against a KV cache (`flash_attn_with_kvcache`), 32 query heads over 8 KV
              heads of 128, B = 1 and 64, T = 4K, 16K, 64K; CUDA-graph replays, roofline: K and V read once

Providers: "book" (this chapter's Triton kernels, `backend="triton"`), "book: Gluon (Hopper)" (the Gluon kernels,
`backend="gluon"`: the forward, and in a backward case, after the Gluon forward, the Gluon dK/dV kernel with
whichever dQ kernel, Triton's or Gluon's, measured faster for the shape; FORWARD, BACKWARD, FA3 and GQA on an sm_90
GPU, n/a elsewhere), "SDPA flash" and "SDPA cuDNN" (PyTorch's scaled_dot_product_attention pinned to one backend, in
its own [B, H, T, D] layout), "FlexAttention" (PyTorch's flex_attention compiled for each shape, causal through a
block mask; FORWARD, BACKWARD, GQA), "FA4" (FlashAttention-4, flash-attn's CuTe DSL kernels, where installed; same
tables) and "eager" (einsum + softmax with the full score matrix in memory). Self-attention: S = T in every case but
DECODE, whose peers are SDPA flash and flash-attn's own flash_attn_with_kvcache (where it is installed).
"""
from __future__ import annotations

import functools
import itertools
import math

import pandas as pd
import torch

from .. import peers
from ..bench import Benchmark, Panel, peak_memory
from .interface import flash_attn_func, flash_attn_varlen_func, flash_attn_with_kvcache
from .reference import attention_eager, attention_flops

DTYPE = torch.bfloat16
SWEEP_T = [1024, 2048, 4096, 8192, 16384, 32768]
FA3_T = [512, 2048, 8192, 16384]  # FlashAttention-3 paper's shapes (it also has 1K, 4K): B * T = 16K tokens, H = 16
MEMORY_T = [1024, 4096, 16384, 65536]
EAGER_MAX_T = 16384  # eager materialises B*H*T^2 scores: 16 GiB at 16K, and >100 ms a call beyond


# ------------------------------------------------------------------ packed sequences
def packed_lengths(total: int, seed: int = 0, median: int = 512, longest: int = 8192) -> list[int]:
    """Sequence lengths that sum to `total`: log-normal (median `median`, sigma 1) rounded and clipped
    to [1, longest], the last one cut to fit. Mostly short sequences and a long tail, as a batch of
    documents packed for training has. Seeded by `seed` on the CPU: the same list on every machine.

    >>> lengths = packed_lengths(16384, seed=0)
    >>> sum(lengths)
    16384
    """
    gen = torch.Generator().manual_seed(seed)
    lengths = []
    while (left := total - sum(lengths)) > 0:
        drawn = round(median * math.exp(torch.randn((), generator=gen, dtype=torch.float64).item()))
        lengths.append(min(max(drawn, 1), longest, left))
    return lengths


def cu_seqlens(lengths, device=None) -> torch.Tensor:
    """The int32 offsets [N + 1] of sequences of these lengths (ints >= 0) packed one after another,
    on `device` (default: the CPU).

    >>> cu_seqlens([3, 0, 2])
    tensor([0, 3, 3, 5], dtype=torch.int32)
    """
    return torch.tensor([0, *itertools.accumulate(lengths)], dtype=torch.int32, device=device)


# ------------------------------------------------------------------ counted work
def flops(c) -> float:
    """`attention_flops` of a benchmark case (S = T)."""
    return attention_flops(c["B"], c["H"], c["T"], c["T"], c["D"], c["causal"], backward=c["pass"] == "bwd")


def bytes_moved(c) -> float:
    """bf16, fwd: q, k, v read + o written, 4·B·D·(T·H + S·Hkv) with S = T (Hkv = H unless the case
    names it); bwd: also dO read and dq, dk, dv written, twice that."""
    q_side = c["B"] * c["T"] * c["H"] * c["D"] * 2
    kv_side = c["B"] * c["T"] * c.get("Hkv", c["H"]) * c["D"] * 2
    return (2 * q_side + 2 * kv_side) * (2 if c["pass"] == "bwd" else 1)


# ------------------------------------------------------------------ providers
def _timed(c, forward, layout):
    """Forward: time forward(q, k, v). Backward: run the forward once, time the autograd
    backward alone (torch.autograd.grad with retain_graph: no .grad accumulation).
    layout: "bthd" (the book's [B, T, H, D]) or "bhtd" (SDPA's own best layout). k and v have c["Hkv"]
    heads where the case names it, else H."""
    B, T, H, D = c["B"], c["T"], c["H"], c["D"]
    bwd = c["pass"] == "bwd"
    shape = (lambda h: (B, T, h, D)) if layout == "bthd" else (lambda h: (B, h, T, D))
    q, k, v = (torch.randn(shape(h), device="cuda", dtype=DTYPE, requires_grad=bwd)
               for h in (H, c.get("Hkv", H), c.get("Hkv", H)))
    if not bwd:
        return lambda: forward(q, k, v)
    out = forward(q, k, v)
    g = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)


def _book(c):
    return _timed(c, lambda q, k, v: flash_attn_func(q, k, v, causal=c["causal"], backend="triton"), "bthd")


def _book_gluon(c):
    """The Gluon kernels (`backend="gluon"`): the forward, or the backward of a Gluon forward (with the dQ kernel
    `interface.backward_kernel` picks); n/a where they cannot run (not an sm_90 GPU; ValueError saying why on the
    first call, which for a backward case is the forward inside `_timed`)."""
    try:
        fn = _timed(c, lambda q, k, v: flash_attn_func(q, k, v, causal=c["causal"], backend="gluon"), "bthd")
        fn()
    except ValueError:
        return None
    return fn


def _sdpa(backend):
    def factory(c):
        attend = peers.sdpa(backend)
        gqa = c.get("Hkv", c["H"]) != c["H"]
        fn = _timed(c, lambda q, k, v: attend(q, k, v, causal=c["causal"], enable_gqa=gqa), "bhtd")
        if gqa:
            try:  # a backend that does not take k and v with fewer heads than q: n/a, not an error
                fn()
            except RuntimeError:
                return None
        return fn
    return factory


def flex_forward(c):
    """FlexAttention compiled for the case's shape: forward(q, k, v) on [B, H, T, D] (k and v with c["Hkv"]
    heads where the case names it), causal as the case says; None without it."""
    compile_for = peers.flex_attention()
    if compile_for is None:
        return None
    attend = compile_for(c["T"], c["T"], c["causal"])
    gqa = c.get("Hkv", c["H"]) != c["H"]
    return lambda q, k, v: attend(q, k, v, enable_gqa=gqa)


FA4_HEAD_DIMS = range(8, 257, 8)  # what FlashAttention-4 takes on Hopper: 8 to 256, a multiple of 8 in bf16


def fa4_forward(c):
    """FlashAttention-4's forward for the case: forward(q, k, v) -> out on [B, T, H, D]; None where it is not
    installed or does not take the case's head dim (the tables are bf16, which it takes)."""
    attend = peers.fa4()
    if attend is None or c["D"] not in FA4_HEAD_DIMS:
        return None

    def forward(q, k, v):
        out = attend(q, k, v, causal=c["causal"])
        return out[0] if isinstance(out, tuple) else out   # (out, lse) in some of its versions
    return forward


def _peer(forward, layout):
    """A provider timing forward(c) (None: n/a) in `layout`, as `_timed` does."""
    def factory(c):
        fn = forward(c)
        return None if fn is None else _timed(c, fn, layout)
    return factory


def _eager(c):
    if c["T"] > EAGER_MAX_T:
        return None  # recorded as "n/a": too slow (and, at 64K, too big) to be worth timing
    return _timed(c, lambda q, k, v: attention_eager(q, k, v, causal=c["causal"]), "bthd")


PROVIDERS = {"book": _book, "book: Gluon (Hopper)": _book_gluon, "SDPA flash": _sdpa("flash"),
             "SDPA cuDNN": _sdpa("cuDNN"), "FlexAttention": _peer(flex_forward, "bhtd"),
             "FA4": _peer(fa4_forward, "bthd"), "eager": _eager}


# ------------------------------------------------------------------ the benchmarks
def _sweep(pass_):
    return [{"B": 1, "T": t, "H": 32, "D": 128, "pass": pass_, "causal": causal}
            for causal in (False, True) for t in SWEEP_T]


FORWARD = Benchmark("flash_attn_fwd", _sweep("fwd"), PROVIDERS, flops, bytes_moved, timer="flushed", module=__name__)
BACKWARD = Benchmark("flash_attn_bwd", _sweep("bwd"), PROVIDERS, flops, bytes_moved, timer="flushed",
                     module=__name__)
FA3 = Benchmark("flash_attn_fa3",
                [{"B": 16384 // t, "T": t, "H": 16, "D": 128, "pass": p, "causal": causal}
                 for p in ("fwd", "bwd") for causal in (False, True) for t in FA3_T],
                {label: PROVIDERS[label] for label in ("book", "book: Gluon (Hopper)", "SDPA flash", "SDPA cuDNN")},
                flops, bytes_moved,
                timer="flushed", module=__name__)
MEMORY = Benchmark("flash_attn_memory",
                   [{"B": 1, "T": t, "H": 32, "D": 128, "pass": "fwd", "causal": False} for t in MEMORY_T],
                   {label: PROVIDERS[label] for label in ("book", "eager", "SDPA flash")}, flops, bytes_moved,
                   measure=peak_memory, module=__name__)


# ------------------------------------------------------------------ GQA: MHA, GQA and MQA at the same FLOPs
GQA_T = [4096, 16384]
GQA_KV_HEADS = [32, 8, 1]  # against 32 query heads: MHA, GQA with groups of 4, MQA


GQA = Benchmark("flash_attn_gqa",
                [{"B": 1, "T": t, "H": 32, "Hkv": hkv, "D": 128, "pass": p, "causal": causal}
                 for p in ("fwd", "bwd") for causal in (False, True) for t in GQA_T for hkv in GQA_KV_HEADS],
                {label: PROVIDERS[label] for label in ("book", "book: Gluon (Hopper)", "SDPA flash", "SDPA cuDNN",
                                                       "FlexAttention", "FA4")},
                flops, bytes_moved,
                timer="flushed", module=__name__)


# ------------------------------------------------------------------ packed sequences: the benchmark
VARLEN_TOKENS, VARLEN_SEED = 16384, 0


def varlen_flops(c) -> float:
    """The work of the sequences themselves, none of the padding: `attention_flops` of each sequence
    alone, summed; fwd+bwd counts the forward and the backward (1 + 2.5 times the forward)."""
    fwd = sum(attention_flops(1, c["H"], n, n, c["D"], c["causal"]) for n in packed_lengths(c["T"], c["seed"]))
    return fwd * (3.5 if c["pass"] == "fwd+bwd" else 1.0)


def varlen_bytes(c) -> float:
    """The packed tensors, bf16: q, k, v read and o written; fwd+bwd adds dO read and dq, dk, dv written,
    and the forward's reads and write again."""
    one = c["T"] * c["H"] * c["D"] * 2
    return (4 + (8 if c["pass"] == "fwd+bwd" else 0)) * one


def _fwd_or_both(c, attend, shape):
    """Random bf16 q, k, v of `shape`; fwd: time attend(q, k, v); fwd+bwd: the forward and then the
    autograd backward of it with a fixed incoming gradient."""
    both = c["pass"] == "fwd+bwd"
    q, k, v = (torch.randn(shape, device="cuda", dtype=DTYPE, requires_grad=both) for _ in range(3))
    if not both:
        return lambda: attend(q, k, v)
    g = torch.randn_like(attend(q, k, v))
    return lambda: torch.autograd.grad(attend(q, k, v), (q, k, v), g)


def _varlen_book(c):
    lengths = packed_lengths(c["T"], c["seed"])
    cu = cu_seqlens(lengths, "cuda")
    return _fwd_or_both(c, lambda q, k, v: flash_attn_varlen_func(q, k, v, cu, cu, max(lengths), max(lengths),
                                                                  causal=c["causal"]), (c["T"], c["H"], c["D"]))


def _padded(attention, layout):
    """Every sequence padded to the longest, one dense call: the work padding costs, timed on the padded
    batch alone (neither the copies in and out nor a mask of the padded keys, which SDPA's flash backend
    cannot take: without the mask a padded call computes the right rows only when causal, so non-causal
    it times the work, not a usable result). attention() gives the function to call; layout: "bthd" or
    "bhtd", the layout it takes."""
    def factory(c):
        attend = attention()
        lengths = packed_lengths(c["T"], c["seed"])
        B, T = len(lengths), max(lengths)
        shape = (B, T, c["H"], c["D"]) if layout == "bthd" else (B, c["H"], T, c["D"])
        return _fwd_or_both(c, lambda q, k, v: attend(q, k, v, causal=c["causal"]), shape)
    return factory


VARLEN = Benchmark("flash_attn_varlen",
                   [{"B": len(packed_lengths(VARLEN_TOKENS, VARLEN_SEED)), "T": VARLEN_TOKENS, "H": 16, "D": 128,
                     "pass": p, "causal": causal, "seed": VARLEN_SEED}
                    for p in ("fwd", "fwd+bwd") for causal in (False, True)],
                   {"book": _varlen_book,
                    "book: padded": _padded(lambda: functools.partial(flash_attn_func, backend="triton"), "bthd"),
                    "SDPA flash: padded": _padded(lambda: peers.sdpa("flash"), "bhtd")},
                   varlen_flops, varlen_bytes, timer="flushed", module=__name__)


# ------------------------------------------------------------------ decoding: one query token against a KV cache
DECODE_T = [4096, 16384, 65536]


def decode_flops(c) -> float:
    """One query token per head over T keys: 4·B·H·T·D (scores and values)."""
    return 4.0 * c["B"] * c["H"] * c["T"] * c["D"]


def decode_bytes(c) -> float:
    """The bf16 K and V caches read once, for the KV heads: 2·B·Hkv·T·D values (q and o are
    H·D per sequence, negligible)."""
    return 2.0 * c["B"] * c["Hkv"] * c["T"] * c["D"] * 2


def _decode_cache(c, layout):
    """q for one token, K and V caches of T tokens (every one attended to), bf16, in "bthd" (flash-attn's
    [B, T, H, D]) or "bhtd" (SDPA's)."""
    B, T, H, Hkv, D = c["B"], c["T"], c["H"], c["Hkv"], c["D"]
    shape = (lambda t, h: (B, t, h, D)) if layout == "bthd" else (lambda t, h: (B, h, t, D))
    q = torch.randn(shape(1, H), device="cuda", dtype=DTYPE)
    k, v = (torch.randn(shape(T, Hkv), device="cuda", dtype=DTYPE) for _ in "kv")
    return q, k, v


def _decode_with(attend):
    """A provider calling attend(q, k_cache, v_cache, cache_seqlens=...) in flash-attn's layout, or None
    where attend is (a peer not installed)."""
    def factory(c):
        if attend is None:
            return None
        q, k, v = _decode_cache(c, "bthd")
        lengths = torch.full((c["B"],), c["T"], device="cuda", dtype=torch.int32)
        return lambda: attend(q, k, v, cache_seqlens=lengths)
    return factory


def _decode_sdpa(c):
    attend = peers.sdpa("flash")
    q, k, v = _decode_cache(c, "bhtd")
    fn = lambda: attend(q, k, v, enable_gqa=True)   # noqa: E731
    try:  # a torch whose flash backend does not take fewer KV heads: n/a, not an error
        fn()
    except RuntimeError:
        return None
    return fn


DECODE = Benchmark("flash_attn_decode",
                   [{"B": b, "T": t, "H": 32, "Hkv": 8, "D": 128} for b in (1, 64) for t in DECODE_T],
                   {"book": _decode_with(flash_attn_with_kvcache), "SDPA flash": _decode_sdpa,
                    "flash-attn": lambda c: _decode_with(peers.flash_attn("flash_attn_with_kvcache"))(c)},
                   decode_flops, decode_bytes, timer="graph", module=__name__)
BENCHMARKS = [FORWARD, BACKWARD, FA3, MEMORY, VARLEN, GQA, DECODE]

HEADLINE = Panel("flash_attn_fwd", {"causal": False}, "T", "tflops", ("book", "SDPA cuDNN", "SDPA flash"),
                 "FlashAttention-2 forward, non-causal\nB=1, H=32, D=128")

ARTICLE_RTX4070 = pd.DataFrame(  # the source article, RTX 4070 (B=1, H=32, D=128, bf16, non-causal)
    {"T": [1024, 2048, 4096, 8192, 16384, 32768],
     "eager ms": [2.81, 13.41, 47.84, 8762.71, "out of memory", "out of memory"],
     "Triton ms": [0.47, 1.43, 6.01, 21.22, 79.09, 318.99],
     "eager memory": ["321 MB", "1183 MB", "4530 MB", "17716 MB (paged to host RAM)", "OOM", "OOM"]}
).set_index("T")
