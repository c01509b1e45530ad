"""Lightning's figure: why the state needs a decay, its norm against the tokens seen, per slope.

    >>> from attention_kernels.lightning.diagram import lightning_state_growth
    >>> lightning_state_growth()         # no decay grows without bound; a decay levels off
"""
from __future__ import annotations

import torch

from ..drawing import finish_figure
from ..plot import BOOK_BLUES, BOOK_MARKERS, column_figure, log2_axis, styled


def lightning_state_norms(slopes, T_max: int = 16384, D: int = 16, seed: int = 0):
    """‖kv_T‖_F at T = 1, 2, 4, … T_max for one head per slope, on SiLU'd random q, k, v (as MiniMax
    feeds the attention: mostly positive, so the k v^T add up instead of cancelling). fp64.

    Returns (T values [n], norms [n, len(slopes)]).

        >>> Ts, norms = lightning_state_norms([0.0, 0.1], T_max=64)
    """
    from .reference import torch_lightning_step

    g = torch.Generator().manual_seed(seed)
    s = torch.as_tensor(slopes, dtype=torch.float64)
    H = s.numel()
    S = torch.zeros(1, H, D, D, dtype=torch.float64)
    Ts, norms = [], []
    for t in range(1, T_max + 1):
        q, k, v = torch.nn.functional.silu(torch.randn(3, 1, H, D, generator=g, dtype=torch.float64)).unbind(0)
        _, S = torch_lightning_step(q, k, v, s, S)
        if t & (t - 1) == 0:
            Ts.append(t)
            norms.append(S[0].flatten(1).norm(dim=1))
    return Ts, torch.stack(norms)


@styled
def lightning_state_growth(slopes=(0.0, 2.0 ** -8, 2.0 ** -4, 1.0), T_max: int = 16384, D: int = 16):
    """‖kv_T‖_F against T (log-log) for each slope: without a decay it grows linearly with T, without
    bound; with λ = e^{-s} it levels off near ‖mean k v^T‖ / (1 - λ), after about 1/s tokens.
    Returns the matplotlib Figure."""
    Ts, norms = lightning_state_norms(slopes, T_max, D)
    fig, (ax,) = column_figure(1, height=3.3)
    for i, s in enumerate(slopes):
        lam = torch.exp(torch.tensor(-float(s))).item()
        label = "s = 0: no decay" if s == 0 else f"s = {s:.4g}: λ = {lam:.4f}"
        ax.plot(Ts, norms[:, i], color=BOOK_BLUES[i % len(BOOK_BLUES)], marker=BOOK_MARKERS[i % len(BOOK_MARKERS)],
                label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    log2_axis(ax, Ts[::2])
    ax.set_xlabel("tokens seen T")
    ax.set_ylabel("state norm ‖kv_T‖")
    ax.legend(loc="upper left")
    ax.set_title(f"Lightning state norm, one head, K = V = {D}, SiLU'd random inputs", loc="left")
    return finish_figure(fig)


__all__ = ["lightning_state_norms", "lightning_state_growth"]
