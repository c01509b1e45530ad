"""KDA's benchmarks on the H200 (bf16 inputs, fp32 state): declarations the shared harness runs.

    DECODE_PLAIN, DECODE_GRAPH   one KDA step at B = 1, 8, 64: plain calls back to back, CUDA-graph replay
    PREFILL                      a whole prompt, T = 1K, 4K, 16K: the book's chunked prefill, fla's
                                 chunk_kda, and causal softmax (SDPA flash)
    PREFILL_GRAPH                PREFILL's B = 1 prompts up to 4K, replayed from a CUDA graph (GPU time)
    TRAIN                        a training step (forward and backward) of chunk_kda, fla's, and SDPA's
    PACKED                       the same step on 16K tokens of packed sequences of long-tailed lengths
                                 (flash_attn.bench.packed_lengths): chunk_kda with cu_seqlens, the same
                                 sequences padded to the longest, fla's chunk_kda with cu_seqlens

    >>> from attention_kernels.bench import run
    >>> df = run(PREFILL)          # times on a GPU, loads results/kda_prefill.csv elsewhere

Cases: B, T, H, D with K = V = D (the decode-step tables have no T). Every provider gets the same
inputs as fla's API takes them: q, k, v, g in bf16 (g = logsigmoid(x) / 16, a log decay per key
channel), beta in bf16 in (0, 1), and q, k normalised inside the kernel (use_qk_l2norm_in_kernel).
Peers come from attention_kernels.peers inside the factories, and give None (an "n/a" row) where they are not
installed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..bench import Benchmark, Panel
from ..linear import costs
from ..linear.chunk import CHUNK
from ..peers import fla
from .interface import chunk_kda, fused_recurrent_kda
from .reference import torch_kda_step

DT = torch.bfloat16
H_DEC, D_DEC = 32, 128


def _inputs(B, T, H, D):
    """q, k, v, g [B, T, H, D] and beta [B, T, H], bf16 on the GPU."""
    q, k, v, x = (torch.randn(B, T, H, D, device="cuda", dtype=DT) for _ in range(4))
    g = (F.logsigmoid(x.float()) / 16).to(DT)
    beta = torch.rand(B, T, H, device="cuda", dtype=DT)
    return q, k, v, g, beta


# ---------------------------------------------------------------- decode
def decode_flops(c):
    """One step, per (batch, head): the decay (K·V), the prediction Sᵀ k (2·K·V), the rank-1
    correction (2·K·V) and the read-out (2·K·V): about 7·K·V, K = V = D."""
    return 7 * c["B"] * c["H"] * c["D"] * c["D"]


# the least a step moves: the fp32 state read and written, q, k, v, g in and o out (bf16); beta is
# one number per head
STEP_BYTES = costs.decode_bytes(vectors_per_token=5)


def _book_step(c):
    q, k, v, g, beta = _inputs(c["B"], 1, c["H"], c["D"])
    S = costs.random_state(c)
    return lambda: fused_recurrent_kda(q, k, v, g, beta, initial_state=S, output_final_state=True,
                                       use_qk_l2norm_in_kernel=True)


def _torch_step(c):
    q, k, v, g, beta = (x[:, 0] for x in _inputs(c["B"], 1, c["H"], c["D"]))
    S = costs.random_state(c)
    return lambda: torch_kda_step(q, k, v, g, beta, S, use_qk_l2norm_in_kernel=True)


def _fla_step(c):
    step = fla("kda", "fused_recurrent_kda")
    if step is None:
        return None
    q, k, v, g, beta = _inputs(c["B"], 1, c["H"], c["D"])
    S = costs.random_state(c)
    return lambda: step(q, k, v, g, beta, initial_state=S, output_final_state=True, use_qk_l2norm_in_kernel=True)


DECODE_CASES = [{"B": b, "H": H_DEC, "D": D_DEC} for b in (1, 8, 64)]
DECODE_PROVIDERS = {"book": _book_step, "PyTorch step": _torch_step, "fla fused_recurrent_kda": _fla_step}

# One step, B = 1, 8, 64: plain Python calls back to back, as a decode loop makes them (a call costs its
# host work or its GPU work, whichever is longer), and the same call replayed from a CUDA graph (GPU
# time alone). The state dominates the bytes: 268 MB at B = 64.
DECODE_PLAIN = Benchmark("kda_decode_plain", DECODE_CASES, DECODE_PROVIDERS, decode_flops, STEP_BYTES,
                         timer="plain", module=__name__)
DECODE_GRAPH = Benchmark("kda_decode_graph", DECODE_CASES, DECODE_PROVIDERS, decode_flops, STEP_BYTES,
                         timer="graph", module=__name__)


# ---------------------------------------------------------------- prefill
def prefill_flops(c):
    """The matmul work of the chunked algorithm: GLA's (costs.chunk_flops:
    the query-key scores, their product with the values, Q S and the state
    update) plus KDA's own, per chunk and head: the key-key scores C(C+1)·K,
    W and Ũ from the inverse 2·C²·(K + V), and W S 2·C·K·V."""
    C, K, V = CHUNK, c["D"], c["D"]
    nt = -(-c["T"] // C)
    return costs.chunk_flops(c) + c["B"] * c["H"] * nt * (C * (C + 1) * K + 2 * C * C * (K + V) + 2 * C * K * V)


prefill_bytes = costs.prefill_bytes(vectors_per_token=5)  # q, k, v, g read and o written once, bf16


def _book_chunk(c):
    q, k, v, g, beta = _inputs(c["B"], c["T"], c["H"], c["D"])
    return lambda: chunk_kda(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)


def _fla_chunk(c):
    chunk = fla("kda", "chunk_kda")
    if chunk is None:
        return None
    q, k, v, g, beta = _inputs(c["B"], c["T"], c["H"], c["D"])
    return lambda: chunk(q, k, v, g, beta, use_qk_l2norm_in_kernel=True)


# B = 1, H = 32, D = 128, T = 1K, 4K, 16K. Plain calls. SDPA flash is the softmax layer of a hybrid
# at the same shape (Kimi Linear interleaves one such layer per three KDA layers).
PREFILL = Benchmark(
    "kda_prefill",
    [{"B": 1, "T": t, "H": 32, "D": 128} for t in (1024, 4096, 16384)],
    {"book: chunk": _book_chunk, "fla chunk_kda": _fla_chunk, "SDPA flash": costs.sdpa_causal},
    prefill_flops, prefill_bytes, timer="flushed", module=__name__)


# ---------------------------------------------------------------- training
def train_flops(c):
    """A training step's work, forward and backward: 3 · prefill_flops (the backward's matmuls are twice
    the forward's, as in GLA's costs.train_flops; the solve's gradient is one more triangular product)."""
    return 3 * prefill_flops(c)


def _train(fn):
    """fn(q, k, v, g, beta, use_qk_l2norm_in_kernel=True) forward and backward to all five, on the case's
    inputs; given cu_seqlens, a packed call (`costs.packed`)."""
    def factory(c, cu_seqlens=None):
        inputs = [x.requires_grad_() for x in _inputs(c["B"], c["T"], c["H"], c["D"])]
        packed = costs.offsets(cu_seqlens)
        return costs.train_step(lambda *x: fn(*x, use_qk_l2norm_in_kernel=True, **packed), inputs, inputs)
    return factory


def _fla_train(c, cu_seqlens=None):
    chunk = fla("kda", "chunk_kda")
    return None if chunk is None else _train(chunk)(c, cu_seqlens)


# B = 1 and 8, H = 32, D = 128, T = 4K and 16K: forward + backward, plain calls. Four vectors in and four
# gradients out per token (q, k, v, g; beta is one number per head).
TRAIN = Benchmark(
    "kda_train",
    [{"B": b, "T": t, "H": 32, "D": 128} for b in (1, 8) for t in (4096, 16384)],
    {"book: chunk": _train(chunk_kda), "fla chunk_kda": _fla_train, "SDPA flash": costs.sdpa_causal_train},
    train_flops, costs.train_bytes(inputs_per_token=4), timer="flushed", module=__name__)

# The training step on packed sequences: 16K tokens of long-tailed lengths (the FlashAttention chapter's mix,
# `costs.packed_cases`), H = 32, D = 128, the L2 norm in the kernel, plain calls. The packed call, the same
# sequences padded to the longest into a [N, T_max, H, D] batch, and fla's packed call; the work is TRAIN's,
# sequence by sequence.
PACKED = Benchmark(
    "kda_packed", costs.packed_cases(H=32, D=128),
    {"book: packed": costs.packed(_train(chunk_kda)), "book: padded": costs.padded(_train(chunk_kda)),
     "fla chunk_kda": costs.packed(_fla_train)},
    costs.per_sequence(TRAIN.flops), costs.per_sequence(TRAIN.bytes_moved), timer="flushed", module=__name__)

# The prompts at B = 1 up to 4K replayed from a CUDA graph: the GPU's time, without the host's
PREFILL_GRAPH = PREFILL.replayed(("book: chunk", "fla chunk_kda", "SDPA flash"))

BENCHMARKS = [DECODE_PLAIN, DECODE_GRAPH, PREFILL, PREFILL_GRAPH, TRAIN, PACKED]

HEADLINE = Panel("kda_prefill", {"B": 1}, "T", "ms", ("book: chunk", "fla chunk_kda", "SDPA flash"),
                 "KDA prefill (SDPA: causal softmax)\nB=1, H=32, D=128")


__all__ = ["DECODE_PLAIN", "DECODE_GRAPH", "PREFILL", "PREFILL_GRAPH", "TRAIN", "PACKED", "BENCHMARKS", "HEADLINE",
           "STEP_BYTES", "decode_flops", "prefill_flops", "prefill_bytes", "train_flops"]
