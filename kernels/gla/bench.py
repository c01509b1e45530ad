"""GLA benchmarks on the H200 (bf16 inputs, fp32 state): decode and prefill.

    decode_context_benchmark()  softmax decode over a T-long KV cache vs one GLA step, T = 4K..64K
                                (two tables, each with its own FLOPs and bytes)
    decode_benchmark(graph)     one GLA step at B = 1, 8, 64 (plain call, or CUDA-graph replay)
    prefill_benchmark()         a whole prompt: chunk-parallel vs the article's chunk kernel vs fla vs SDPA

Each returns the tidy table of `kernels.bench.run_or_load` (timed on a GPU, loaded elsewhere).
Peers (fla) are imported inside their factories only, and give None when absent.
"""
from __future__ import annotations

import pandas as pd
import torch
import torch.nn.functional as F

from ..bench import in_fresh_process, run_or_load, time_graph_ms, time_ms
from . import chunk_gla, fused_recurrent_gla, naive_recurrent_gla, sequential_chunk_gla, torch_gla_step

DT = torch.bfloat16
H_DEC, D_DEC = 32, 128
CHUNK = 64


def _qkvg(B, T, H, K, V, device="cuda"):
    q = torch.randn(B, T, H, K, device=device, dtype=DT)
    k = torch.randn(B, T, H, K, device=device, dtype=DT)
    v = torch.randn(B, T, H, V, device=device, dtype=DT)
    gk = (F.logsigmoid(torch.randn(B, T, H, K, device=device)) / 16).to(DT)   # the paper's gate
    return q, k, v, gk


# ---------------------------------------------------------------- decode
def decode_flops(c):
    """One step: decay + rank-1 update (2·K·V) and the read-out (2·K·V), per (batch, head)."""
    return 4 * c["B"] * c["H"] * c["K"] * c["V"]


def decode_bytes(c):
    """fp32 state read + write, plus q, k, gk, v in and o out (bf16): the least a step must move."""
    B, H, K, V = c["B"], c["H"], c["K"], c["V"]
    return 2 * B * H * K * V * 4 + B * H * (3 * K + 2 * V) * 2


def _book_step(c):
    q, k, v, gk = _qkvg(c["B"], 1, c["H"], c["K"], c["V"])
    S = torch.randn(c["B"], c["H"], c["K"], c["V"], device="cuda")
    return lambda: fused_recurrent_gla(q, k, v, gk, initial_state=S, output_final_state=True)


def _torch_step(c):
    q, k, v, gk = (x[:, 0] for x in _qkvg(c["B"], 1, c["H"], c["K"], c["V"]))
    S = torch.randn(c["B"], c["H"], c["K"], c["V"], device="cuda")
    return lambda: torch_gla_step(q, k, v, gk, S)


def _fla_step(c):
    try:
        from fla.ops.gla import fused_recurrent_gla as fla_fused_recurrent_gla
    except ImportError:
        return None
    q, k, v, gk = _qkvg(c["B"], 1, c["H"], c["K"], c["V"])
    S = torch.randn(c["B"], c["H"], c["K"], c["V"], device="cuda")
    return lambda: fla_fused_recurrent_gla(q, k, v, gk, initial_state=S, output_final_state=True)


DECODE_PROVIDERS = {"book": _book_step, "PyTorch step": _torch_step, "fla fused_recurrent_gla": _fla_step}


@in_fresh_process
def decode_benchmark(graph: bool = True):
    """One GLA decode step, B = 1, 8, 64, H = 32, K = V = 128, bf16 inputs, fp32 state.

    graph=False: plain Python calls timed by do_bench (launch and wrapper overhead included),
    table 'gla_decode_plain'. graph=True: the same call replayed from a CUDA graph,
    table 'gla_decode_graph'. Bytes: `decode_bytes` (the state dominates: 268 MB at B = 64).
    """
    cases = [{"B": b, "H": H_DEC, "K": D_DEC, "V": D_DEC} for b in (1, 8, 64)]
    name, timer = ("gla_decode_graph", time_graph_ms) if graph else ("gla_decode_plain", time_ms)
    return run_or_load(name, cases, DECODE_PROVIDERS, decode_flops, decode_bytes, timer=timer)


def _sdpa_decode(c):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    B, H, T, D = c["B"], c["H"], c["T"], c["D"]
    q = torch.randn(B, H, 1, D, device="cuda", dtype=DT)
    kc = torch.randn(B, H, T, D, device="cuda", dtype=DT)
    vc = torch.randn(B, H, T, D, device="cuda", dtype=DT)

    def step():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, kc, vc)
    return step


def _ctx(factory):
    return lambda c: factory({"B": c["B"], "H": c["H"], "K": c["D"], "V": c["D"]})


@in_fresh_process
def decode_context_benchmark():
    """Decode one token at context length T = 4K..64K (B = 1, H = 32, D = 128, bf16), graph-replayed.

    Two operations, two tables, each with its own counted work, concatenated for the plot:
    'gla_decode_context_softmax': SDPA flash, one query over a T-long KV cache,
        4·B·H·T·D FLOPs and the 2·B·H·T·D bf16 cache read (its roofline grows with T);
    'gla_decode_context_gla': one GLA step ('book', 'PyTorch step'), `decode_flops` and
        `decode_bytes` (the fixed fp32 state read + write, whatever T is).
    """
    cases = [{"B": 1, "H": H_DEC, "D": D_DEC, "T": t} for t in (4096, 8192, 16384, 32768, 65536)]
    softmax = run_or_load("gla_decode_context_softmax", cases, {"SDPA flash": _sdpa_decode},
                          flops=lambda c: 4 * c["B"] * c["H"] * c["T"] * c["D"],
                          bytes=lambda c: 2 * c["B"] * c["H"] * c["T"] * c["D"] * 2, timer=time_graph_ms)
    step = {"B": 1, "H": H_DEC, "K": D_DEC, "V": D_DEC}
    gla = run_or_load("gla_decode_context_gla", cases, {"book": _ctx(_book_step), "PyTorch step": _ctx(_torch_step)},
                      flops=lambda c: decode_flops(step), bytes=lambda c: decode_bytes(step), timer=time_graph_ms)
    df = pd.concat([softmax, gla], ignore_index=True)
    df.attrs["meta"] = gla.attrs["meta"]
    return df


# ---------------------------------------------------------------- prefill
def prefill_flops(c):
    """Matmul work of the chunk algorithm (chunk C = 64, NT = ceil(T / C) chunks), per (batch, head):

    per chunk, intra scores Q K^T on the causal triangle: C(C+1)/2 pairs x 2K = C(C+1)·K;
    intra A V on the same triangle: C(C+1)·V; inter (Q ⊙ e^b) S: 2·C·K·V;
    state update (K ⊙ e^{b_C - b})^T V: 2·C·K·V. Total B·H·NT·(C(C+1)(K+V) + 4·C·K·V).
    The same count is used for every provider (SDPA's own work is different: read its ms).
    At K = V = 128 that is 5.3 MFLOP per chunk and head, 64 FLOP per byte of `prefill_bytes`:
    below the H200's ~160 FLOP/byte ridge, so the roofline is the memory floor (reading
    q, k, v, gk and writing o once); the chunk states and scores are extra traffic on top.
    """
    C, K, V = CHUNK, c["D"], c["D"]
    nt = -(-c["T"] // C)
    return c["B"] * c["H"] * nt * (C * (C + 1) * (K + V) + 4 * C * K * V)


def prefill_bytes(c):
    """Read q, k, gk, v and write o once (bf16): B·T·H·(3K + 2V)·2."""
    return c["B"] * c["T"] * c["H"] * (3 * c["D"] + 2 * c["D"]) * 2


def _prefill(fn):
    def factory(c):
        q, k, v, gk = _qkvg(c["B"], c["T"], c["H"], c["D"], c["D"])
        return lambda: fn(q, k, v, gk)
    return factory


def _fla_chunk(c):
    try:
        from fla.ops.gla import chunk_gla as fla_chunk_gla
    except ImportError:
        return None
    q, k, v, gk = _qkvg(c["B"], c["T"], c["H"], c["D"], c["D"])
    return lambda: fla_chunk_gla(q, k, v, gk)


def _sdpa_causal(c):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    q, k, v = (torch.randn(c["B"], c["H"], c["T"], c["D"], device="cuda", dtype=DT) for _ in range(3))

    def run():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    return run


def _torch_loop(c):
    if c["T"] > 1024:
        return None  # tens of ms per 1K tokens: only the first point
    return _prefill(naive_recurrent_gla)(c)


def _sequential(c):
    if c["T"] > 4096:
        return None  # one launch per chunk, linear in T: three points show the slope
    return _prefill(sequential_chunk_gla)(c)


PREFILL_PROVIDERS = {
    "book: chunk": _prefill(chunk_gla),
    "book: sequential chunk": _sequential,
    "fla chunk_gla": _fla_chunk,
    "SDPA flash": _sdpa_causal,
    "PyTorch step loop": _torch_loop,
}


@in_fresh_process
def prefill_benchmark():
    """GLA prefill, B = 1, H = 32, D = 128, T = 1K..16K, plus fla's test shape B = 4, T = 2048, H = 16.

    Providers: 'book: chunk' (chunk_gla), 'book: sequential chunk' (the article's kernel,
    T <= 4K), 'fla chunk_gla', 'SDPA flash' (causal softmax at the same shape), 'PyTorch step
    loop' (T = 1K only). FLOPs: `prefill_flops`; bytes: `prefill_bytes`. Table 'gla_prefill'.
    """
    cases = [{"B": 1, "T": t, "H": 32, "D": 128} for t in (1024, 2048, 4096, 8192, 16384)]
    cases.append({"B": 4, "T": 2048, "H": 16, "D": 128})
    return run_or_load("gla_prefill", cases, PREFILL_PROVIDERS, prefill_flops, prefill_bytes)
