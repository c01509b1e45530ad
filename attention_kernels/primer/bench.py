"""The primer's benchmarks on the H200 (bf16, do_bench medians): two
memory-bound kernels against PyTorch, read against the copy-bandwidth
ceiling.

    VECTOR_ADD   x + y for n = B·T·H·D elements (B=1, H=32, D=128: one
                 layer's q), T = 1K..64K
    SOFTMAX      a row softmax of scores [B, H, T, S] (B=1, H=32, T=1024
                 query rows), row length S = 256..16K

    >>> from attention_kernels.bench import run
    >>> df = run(VECTOR_ADD, SOFTMAX)
    ...     # times on a GPU, loads results/primer_*.csv elsewhere

Both kernels read each input once and write the output once, and do a few
FLOPs per element: their roofline is bytes moved / copy bandwidth (the matmul
ceiling is thousands of times further away).
"""
from __future__ import annotations

import torch

from ..bench import Benchmark
from .interface import softmax_rows, vector_add

DT = torch.bfloat16
ESIZE = 2  # bytes per bf16 element


# ---------------------------------------------------------------- vector add
def add_elements(c) -> int:
    return c["B"] * c["T"] * c["H"] * c["D"]


def add_flops(c) -> float:
    """One addition per element."""
    return add_elements(c)


def add_bytes(c) -> float:
    """Read x and y, write x + y: three bf16 vectors."""
    return 3 * add_elements(c) * ESIZE


def _add(fn):
    def factory(c):
        x, y = (torch.randn(add_elements(c), device="cuda", dtype=DT) for _ in range(2))
        return lambda: fn(x, y)
    return factory


VECTOR_ADD = Benchmark("primer_vector_add", [{"B": 1, "T": t, "H": 32, "D": 128} for t in (1024, 4096, 16384, 65536)],
                       {"book": _add(vector_add), "PyTorch": _add(torch.add)}, add_flops, add_bytes,
                       timer="flushed", module=__name__)


# ---------------------------------------------------------------- row
# softmax
def softmax_elements(c) -> int:
    return c["B"] * c["H"] * c["T"] * c["S"]


def softmax_flops(c) -> float:
    """About five operations per element: max, subtract, exp2, sum,
    divide."""
    return 5 * softmax_elements(c)


def softmax_bytes(c) -> float:
    """Read the scores once and write the probabilities once (bf16)."""
    return 2 * softmax_elements(c) * ESIZE


def _softmax(fn):
    def factory(c):
        x = torch.randn(c["B"] * c["H"] * c["T"], c["S"], device="cuda", dtype=DT)
        return lambda: fn(x)
    return factory


SOFTMAX = Benchmark("primer_softmax",
                    [{"B": 1, "H": 32, "T": 1024, "S": s} for s in (256, 1024, 4096, 16384)],
                    {"book": _softmax(softmax_rows), "PyTorch": _softmax(lambda x: torch.softmax(x, dim=-1))},
                    softmax_flops, softmax_bytes, timer="flushed", module=__name__)

BENCHMARKS = [VECTOR_ADD, SOFTMAX]

# The primer's kernels are not attention: they add no panel to the book's
# headline figure.
HEADLINE = None


__all__ = ["VECTOR_ADD", "SOFTMAX", "BENCHMARKS", "HEADLINE", "add_bytes", "softmax_bytes"]
