"""FlashAttention's figures, drawn from the kernel's own numbers: the forward's tiles (`FWD_TILES`)
and key ranges, and the online softmax worked through `reference.online_softmax_steps`.

    >>> from attention_kernels.flash_attn.diagram import fa_tiling
    >>> fa_tiling()                      # the forward's tiles for D = 128, causal
"""
from __future__ import annotations

import math
import types

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch, Rectangle

from ..drawing import C_MASK, C_SKIP, C_TEXT, C_WORK, C_WORK2, finish_figure
from ..plot import BOOK_BLUES, COLUMN_INCHES, styled

# The default worked example of the online softmax: twelve scores in blocks of four, the maximum in
# block 2 (not block 0), so the running max rises twice and the running sum is rescaled twice.
ONLINE_SOFTMAX_EXAMPLE = (0.5, 1.2, -0.3, 0.8, 2.1, 0.4, 2.9, -1.0, 1.5, 3.6, 0.2, 2.4)
ONLINE_SOFTMAX_BLOCK = 4


def online_softmax_example() -> torch.Tensor:
    """The default scores of the online-softmax example (float64, 12 values, blocks of 4)."""
    return torch.tensor(ONLINE_SOFTMAX_EXAMPLE, dtype=torch.float64)


def online_softmax_table(x: torch.Tensor | None = None, block: int = ONLINE_SOFTMAX_BLOCK) -> list[dict]:
    """Per block: its scores, the running max m and sum l after it, and the factor alpha = e^(m_old - m_new)
    that rescaled the old sum (None for the first block), computed by `online_softmax_steps`."""
    from .reference import online_softmax_steps

    x = online_softmax_example() if x is None else x
    steps, _ = online_softmax_steps(x, block)
    rows, m_old, l_old = [], None, 0.0
    for s in steps:
        alpha = None if m_old is None else math.exp(m_old - s["m"])
        rows.append({**s, "alpha": alpha, "old": 0.0 if alpha is None else l_old * alpha,
                     "rescaled": alpha is not None and s["m"] > m_old})
        m_old, l_old = s["m"], s["l"]
    return rows



def _key_ranges(m0, T, S, BM, BN, causal):
    """The forward kernel's own `_key_ranges`, evaluated in Python (tl.minimum/maximum as min/max)."""
    from . import forward

    fn = forward._key_ranges.fn
    shim = types.SimpleNamespace(minimum=min, maximum=max)
    return types.FunctionType(fn.__code__, {**fn.__globals__, "tl": shim})(m0, T, S, BM, BN, causal)


@styled
def fa_tiling(T: int = 600, S: int | None = None, D: int = 128, causal: bool = True, program: int | None = None):
    """The FlashAttention forward's tiling of the T x S score matrix for head dim D: one program's query
    block (BM rows, from `forward.FWD_TILES`), the key blocks (BN columns) it walks with no mask, the
    blocks on the causal diagonal or past the ragged end that need the mask, and the blocks it skips.
    The ranges come from the kernel's own `_key_ranges`. T, S: lengths (S defaults to T); program:
    the query block to highlight (default: the second to last)."""
    from .forward import FWD_TILES

    S = T if S is None else S
    BM, BN = FWD_TILES[D][:2]
    n_m, n_n = math.ceil(T / BM), math.ceil(S / BN)
    program = n_m - 2 if program is None else program
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 5.6))
    counts = {}
    for i in range(n_m):
        full_end, hi = _key_ranges(i * BM, T, S, BM, BN, causal)
        rows = min(BM, T - i * BM)
        for j in range(n_n):
            k0, cols = j * BN, min(BN, S - j * BN)
            kind = "unmasked" if k0 + cols <= full_end else ("masked" if k0 < hi else "skipped")
            color = {"unmasked": C_WORK2, "masked": C_MASK, "skipped": C_SKIP}[kind]
            mine = i == program
            ax.add_patch(Rectangle((k0, i * BM), cols, rows, facecolor=color, edgecolor="white", lw=1.0,
                                   alpha=1.0 if mine or kind == "skipped" else 0.3))
            if mine:
                counts[kind] = counts.get(kind, 0) + 1
    ax.add_patch(Rectangle((0, program * BM), S, min(BM, T - program * BM), fill=False, edgecolor=C_WORK, lw=2.5))
    if causal:  # query i sees key j iff j <= i + S - T
        i0 = max(0, T - S)
        ax.plot([i0 + S - T, S], [i0, T], color=C_TEXT, lw=1.2, ls="--")
    y_mid = program * BM + min(BM, T - program * BM) / 2
    hi = _key_ranges(program * BM, T, S, BM, BN, causal)[1]
    ax.annotate("", xy=(hi - BN * 0.2, y_mid), xytext=(BN * 0.2, y_mid),
                arrowprops=dict(arrowstyle="-|>", color="white", lw=2.0))
    ax.set_xlim(0, S)
    ax.set_ylim(T, 0)
    ax.set_aspect("equal")
    ax.set_xticks(range(0, S + 1, BN * 2 if n_n > 8 else BN))
    ax.set_yticks(range(0, T + 1, BM))
    ax.grid(False)
    ax.set_xlabel(f"key position j (blocks of BN = {BN})")
    ax.set_ylabel(f"query position i (blocks of BM = {BM})")
    legend = [Patch(color=C_WORK2, label=f"walked, no mask ({counts.get('unmasked', 0)} blocks)"),
              Patch(color=C_MASK, label=f"walked with the mask ({counts.get('masked', 0)})"),
              Patch(color=C_SKIP, label=f"skipped ({counts.get('skipped', 0)})")]
    fig.legend(handles=legend, loc="outside lower center", ncols=3, title=f"query block {program} (outlined)")
    shape = f"T = {T}, S = {S}, D = {D}, {'causal' if causal else 'not causal'}"
    ax.set_title(f"One program's walk over the score matrix ({shape})", loc="left")
    return finish_figure(fig)


@styled
def online_softmax_blocks(x: torch.Tensor | None = None, block: int = ONLINE_SOFTMAX_BLOCK):
    """The online softmax on one row of scores, a block at a time (numbers from `online_softmax_steps`):
    top, the scores and the running max m after each block; bottom, the running sum l after each block,
    split into the old sum rescaled by alpha = e^(m_old - m_new) and the new block's share.
    The default example puts the maximum in a later block, so the rescale happens."""
    x = online_softmax_example() if x is None else x
    rows = online_softmax_table(x, block)
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(COLUMN_INCHES, 5.6), height_ratios=[1.25, 1])
    colors = [BOOK_BLUES[i % 3] for i in range(len(rows))]
    for r, c in zip(rows, colors):
        pos = [r["block"] * block + i for i in range(len(r["scores"]))]
        top.bar(pos, r["scores"], color=c, width=0.8)
        top.hlines(r["m"], -0.5, pos[-1] + 0.5, color=C_MASK, lw=2.2)
        top.text(pos[-1] + 0.45, r["m"] + 0.12, f"m = {r['m']:.2f}", ha="right", va="bottom", color=C_MASK,
                 fontsize=10)
        if r["block"]:
            top.axvline(pos[0] - 0.5, color=C_TEXT, lw=0.8, ls=":")
    top.set_xticks(range(x.numel()))
    top.set_xlim(-0.6, x.numel() - 0.4)
    top.set_ylim(min(0.0, float(x.min())) - 0.3, float(x.max()) + 1.0)
    top.set_xlabel("key position j (colour: block)")
    top.set_ylabel("score $z_j$")
    top.grid(axis="x", visible=False)
    top.set_title("Running max m (orange) after each block: when it rises, the old sum ℓ is rescaled", loc="left")
    labels = [f"block {r['block']}" for r in rows]
    olds = [r["old"] for r in rows]
    news = [r["l"] - r["old"] for r in rows]
    bottom.bar(labels, olds, color=C_SKIP, edgecolor=C_TEXT, label="old sum × α (rescaled)")
    bottom.bar(labels, news, bottom=olds, color=colors, label="this block's Σ e^(s − m)")
    for k, r in enumerate(rows):
        note = "first block" if r["alpha"] is None else f"α = e^(m_old − m) = {r['alpha']:.3f}"
        bottom.text(k, r["l"] * 1.03, f"ℓ = {r['l']:.3f}\n{note}", ha="center", va="bottom", fontsize=9.5)
    bottom.set_ylim(0, max(r["l"] for r in rows) * 1.9)
    bottom.set_ylabel("running sum ℓ")
    bottom.grid(axis="x", visible=False)
    bottom.legend(loc="upper left", ncols=2)
    return finish_figure(fig)


__all__ = ["fa_tiling", "online_softmax_blocks", "online_softmax_example", "online_softmax_table",
           "ONLINE_SOFTMAX_EXAMPLE", "ONLINE_SOFTMAX_BLOCK"]
