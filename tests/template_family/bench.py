"""The template family's benchmark declaration: one decode step, replayed
from a CUDA graph.

Cases: B, H, D with K = V = D (a step has no T). The shared harness
(attention_kernels.bench) times it.
"""
from __future__ import annotations

import torch

from ..bench import Benchmark
from ..linear import costs
from .interface import fused_recurrent_linear

STEP_BYTES = costs.decode_bytes(vectors_per_token=4)  # q, k, v in, o out, and the state read and written


def _book_step(c):
    q, k, v = (torch.randn(c["B"], 1, c["H"], c["D"], device="cuda", dtype=costs.DT) for _ in range(3))
    S = costs.random_state(c)
    return lambda: fused_recurrent_linear(q, k, v, initial_state=S, output_final_state=True)


DECODE_GRAPH = Benchmark("template_decode_graph", [{"B": b, "H": 32, "D": 128} for b in (1, 8, 64)],
                         {"book": _book_step}, costs.decode_flops, STEP_BYTES, module=__name__)
BENCHMARKS = [DECODE_GRAPH]
HEADLINE = None  # no panel in the book's headline figure
