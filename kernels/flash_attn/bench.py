"""Benchmark definitions for the FlashAttention-2 chapter (H200, bf16, do_bench medians).

Each function runs the sweep on a GPU (and saves results/<name>.csv + .json) or, on a CPU,
loads the committed table. Providers: "book" (this chapter's Triton kernels), "SDPA flash",
"SDPA cuDNN" (torch.nn.attention.sdpa_kernel backends) and "eager" (einsum + softmax with the
full score matrix in memory; it records OOM where it no longer fits).
"""
from __future__ import annotations

import math

import pandas as pd
import torch

from ..bench import in_fresh_process, load, metadata, run_or_load, save, will_time
from .forward import attention_flops
from .interface import flash_attn_func
from .reference import attention_eager

DTYPE = torch.bfloat16
SWEEP_N = [1024, 2048, 4096, 8192, 16384, 32768]
FA3_N = [512, 2048, 8192, 16384]  # FlashAttention-3 paper's shapes (it also has 1K, 4K): B * N = 16K tokens, H = 16
MEMORY_N = [1024, 4096, 16384, 65536]
EAGER_MAX_N = 16384  # eager materialises B*H*N^2 scores: 16 GiB at 16K, and >100 ms a call beyond


# ------------------------------------------------------------------ counted work
def flops(c) -> float:
    """`attention_flops` of a benchmark case (T = S = N)."""
    return attention_flops(c["B"], c["H"], c["N"], c["N"], c["D"], c["causal"], backward=c.get("pass") == "bwd")


def bytes_moved(c) -> float:
    """fwd: q, k, v read + o written; bwd: also dO read and dq, dk, dv written (bf16)."""
    one = c["B"] * c["N"] * c["H"] * c["D"] * 2
    return (4 + (4 if c.get("pass", "fwd") == "bwd" else 0)) * one


# ------------------------------------------------------------------ providers
def _qkv(c, layout, requires_grad):
    B, N, H, D = c["B"], c["N"], c["H"], c["D"]
    shape = (B, N, H, D) if layout == "bthd" else (B, H, N, D)  # SDPA gets its own best layout
    return [torch.randn(shape, device="cuda", dtype=DTYPE, requires_grad=requires_grad) for _ in range(3)]


def _as_timed(c, forward, layout):
    """Forward: time forward(q, k, v). Backward: run the forward once, time the autograd
    backward alone (torch.autograd.grad with retain_graph: no .grad accumulation)."""
    bwd = c.get("pass", "fwd") == "bwd"
    q, k, v = _qkv(c, layout, requires_grad=bwd)
    if not bwd:
        return lambda: forward(q, k, v)
    out = forward(q, k, v)
    g = torch.randn_like(out)
    return lambda: torch.autograd.grad(out, (q, k, v), g, retain_graph=True)


def _book(c):
    return _as_timed(c, lambda q, k, v: flash_attn_func(q, k, v, causal=c["causal"]), "bthd")


def _sdpa(backend_name):
    def factory(c):
        from torch.nn.attention import SDPBackend, sdpa_kernel
        from torch.nn.functional import scaled_dot_product_attention as sdpa

        backend = getattr(SDPBackend, backend_name)

        def forward(q, k, v):
            with sdpa_kernel(backend):
                return sdpa(q, k, v, is_causal=c["causal"])

        return _as_timed(c, forward, "bhtd")
    return factory


def _eager(c):
    if c["N"] > EAGER_MAX_N:
        return None  # recorded as "n/a": too slow (and, at 64K, too big) to be worth timing
    return _as_timed(c, lambda q, k, v: attention_eager(q, k, v, causal=c["causal"]), "bthd")


PROVIDERS = {"book": _book, "SDPA flash": _sdpa("FLASH_ATTENTION"),
             "SDPA cuDNN": _sdpa("CUDNN_ATTENTION"), "eager": _eager}


# ------------------------------------------------------------------ the sweeps
def _sweep_cases(pass_):
    return [{"pass": pass_, "B": 1, "H": 32, "N": n, "D": 128, "causal": causal}
            for causal in (False, True) for n in SWEEP_N]


@in_fresh_process
def forward_benchmark() -> pd.DataFrame:
    """Forward, B=1, H=32, D=128, N = 1K..32K, causal and not."""
    return run_or_load("flash_attn_fwd", _sweep_cases("fwd"), PROVIDERS, flops, bytes_moved)


@in_fresh_process
def backward_benchmark() -> pd.DataFrame:
    """Backward alone (dq, dk, dv from a saved forward), same shapes as `forward_benchmark`."""
    return run_or_load("flash_attn_bwd", _sweep_cases("bwd"), PROVIDERS, flops, bytes_moved)


@in_fresh_process
def fa3_benchmark() -> pd.DataFrame:
    """The FlashAttention-3 paper's shapes: B·N = 16K tokens, H = 16, D = 128; fwd and bwd."""
    cases = [{"pass": p, "B": 16384 // n, "H": 16, "N": n, "D": 128, "causal": causal}
             for p in ("fwd", "bwd") for causal in (False, True) for n in FA3_N]
    providers = {k: v for k, v in PROVIDERS.items() if k != "eager"}
    return run_or_load("flash_attn_fa3", cases, providers, flops, bytes_moved)


def _peak_memory(c, provider):
    """Peak bytes allocated while one forward runs (inputs included), and the inputs alone;
    None where the provider does not run this case."""
    fn = PROVIDERS[provider](c)
    if fn is None:
        return None
    fn()  # compile outside the measurement
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    out = fn()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated()
    del out, fn
    return peak, base


@in_fresh_process
def memory_benchmark() -> pd.DataFrame:
    """Peak GPU memory of one forward (torch.cuda.max_memory_allocated), eager vs book, non-causal,
    B=1, H=32, D=128, bf16, N = 1K..64K (eager up to 16K). Columns peak_gib (inputs included), extra_gib (beyond
    q, k, v) and inputs_gib; ms etc. are NaN (times are in `forward_benchmark`)."""
    name = "flash_attn_memory"
    if not will_time():
        return load(name)
    rows = []
    for n in MEMORY_N:
        c = {"pass": "fwd", "B": 1, "H": 32, "N": n, "D": 128, "causal": False}
        for provider in ("book", "eager", "SDPA flash"):
            row = {"name": name, "provider": provider, **c, "ms": math.nan, "tflops": math.nan, "gbps": math.nan,
                   "roofline_ms": math.nan, "pct_roofline": math.nan, "note": "",
                   "peak_gib": math.nan, "extra_gib": math.nan, "inputs_gib": math.nan}
            try:
                measured = _peak_memory(c, provider)
                if measured is None:
                    row["note"] = "n/a"
                else:
                    peak, base = measured
                    row.update(peak_gib=peak / 2**30, extra_gib=(peak - base) / 2**30, inputs_gib=base / 2**30)
            except torch.OutOfMemoryError:
                row["note"] = "OOM"
            finally:
                torch.cuda.empty_cache()
            rows.append(row)
    save(pd.DataFrame(rows), name, metadata())
    return load(name)


def ratio_table(df: pd.DataFrame, pass_: str | None = None, base: str = "SDPA flash") -> pd.DataFrame:
    """TFLOP/s per provider (columns) for each (causal, N), plus book / base and book / cuDNN."""
    part = df if pass_ is None else df[df["pass"] == pass_]
    t = part.pivot_table(index=["causal", "N"], columns="provider", values="tflops").round(0)
    if "book" in t:
        t[f"book / {base}"] = (t["book"] / t[base]).round(2)
        if "SDPA cuDNN" in t:
            t["book / cuDNN"] = (t["book"] / t["SDPA cuDNN"]).round(2)
    return t


ARTICLE_RTX4070 = pd.DataFrame(  # the source article, RTX 4070 (B=1, H=32, D=128, bf16, non-causal)
    {"N": [1024, 2048, 4096, 8192, 16384, 32768],
     "eager ms": [2.81, 13.41, 47.84, 8762.71, math.nan, math.nan],
     "Triton ms": [0.47, 1.43, 6.01, 21.22, 79.09, 318.99],
     "eager memory": ["321 MB", "1183 MB", "4530 MB", "17716 MB (paged to host RAM)", "OOM", "OOM"]}
).set_index("N")
