"""MLA's figures: the split-KV merge (with the slice counts of MLA's launch, `planning.num_splits`)
and the warp-specialized decode's timeline, simulated in the order of `gluon_decode`'s partitions.

    >>> from attention_kernels.mla.diagram import split_kv_merge
    >>> split_kv_merge()                 # four slices of one cache, merged by log-sum-exp
"""
from __future__ import annotations

import math

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import Patch

from ..drawing import C_LIGHT, C_MASK, C_SKIP, C_TEXT, C_WORK, C_WORK2, draw_arrow, draw_box, finish_figure
from ..plot import BOOK_BLUES, COLUMN_INCHES, styled


@styled
def split_kv_merge(n_splits: int = 4, length: int = 64, seed: int = 0):
    """Split-KV decode: each slice of one sequence's cache is one program, which writes a partial output
    o_s (normalised over its slice) and its log-sum-exp lse_s; the combine kernel merges them with the
    weights e^(lse_s - lse). The numbers are a small worked example (scalar values, `length` positions,
    computed here and checked against one softmax over the whole cache); the title gives the slice
    counts MLA's launch picks on an H200 (`attention_kernels.mla.planning.num_splits`)."""
    from .planning import PLAN_HEAD_BLOCK, PLAN_SM_COUNT, num_splits

    gen = torch.Generator().manual_seed(seed)
    s = torch.randn(length, generator=gen, dtype=torch.float64) * 2
    v = torch.randn(length, generator=gen, dtype=torch.float64)
    edges = [round(k * length / n_splits) for k in range(n_splits + 1)]
    lse_s = [torch.logsumexp(s[a:b], 0).item() for a, b in zip(edges, edges[1:])]
    o_s = [(torch.softmax(s[a:b], 0) * v[a:b]).sum().item() for a, b in zip(edges, edges[1:])]
    lse = torch.logsumexp(torch.tensor(lse_s, dtype=torch.float64), 0).item()
    w = [math.exp(x - lse) for x in lse_s]
    o = sum(wi * oi for wi, oi in zip(w, o_s))
    assert abs(o - (torch.softmax(s, 0) * v).sum().item()) < 1e-12  # the merge is exact
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 4.6))
    width = 1.0 / n_splits
    for k, (a, b) in enumerate(zip(edges, edges[1:])):
        x0 = k * width
        draw_box(ax, x0 + 0.01, 3.3, width - 0.02, 0.45, f"positions {a}–{b - 1}", BOOK_BLUES[k % 3],
             text_color="white" if k % 3 < 2 else C_TEXT)
        draw_arrow(ax, (x0 + width / 2, 3.28), (x0 + width / 2, 2.62))
        draw_box(ax, x0 + 0.02, 1.9, width - 0.04, 0.7, f"program {k}\no = {o_s[k]:+.3f}\nlse = {lse_s[k]:.3f}",
             "white")
        ax.text(x0 + width / 2, 1.72, f"w = {w[k]:.3f}", fontsize=10, ha="center", va="center", color=C_MASK,
                bbox=dict(facecolor="white", edgecolor="none", pad=1))
        draw_arrow(ax, (x0 + width / 2, 1.6), (0.5, 1.0))
    draw_box(ax, 0.18, 0.15, 0.64, 0.82,
         f"combine: lse = log Σ e^(lse_s) = {lse:.3f}\nw_s = e^(lse_s − lse),  o = Σ w_s o_s = {o:+.4f}\n"
         "(equal to one softmax over the whole cache)", C_LIGHT)
    ax.text(0.0, 3.95, "one sequence's cache, cut into slices", fontsize=10)
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(0.0, 4.2)
    ax.axis("off")
    picks = ", ".join(f"B={b}: {num_splits(b, 128 // PLAN_HEAD_BLOCK, 16384, PLAN_SM_COUNT)}" for b in (1, 8, 32, 128))
    ax.set_title(f"Split-KV decode: one program per slice, merged by log-sum-exp\n"
                 f"(slices MLA's launch picks at T = 16K, H = 128: {picks})", loc="left")
    return finish_figure(fig)


def _pingpong_schedule(n_tiles: int, t_load: int, t_s: int, t_soft: int, t_pv: int):
    """Simulate the order of `gluon_decode._ws_consumer` and `_ws_load_partition` with unit durations:
    returns {row: [(start, length, kind, tile)]}. The tensor cores do one product at a time; a ring
    slot is refilled once both warpgroups have released its previous tile."""
    from .gluon_decode import STAGES

    # Each warpgroup's program, in the kernel's order: tiles in pairs (2k, 2k + 1), warpgroup w owning tile
    # 2k + w; it scores its own tile and takes its softmax, then adds both tiles' P V, the older tile first.
    progs = {}
    for wg in (0, 1):
        ops = []
        for t in range(wg, n_tiles, 2):
            pair = [t, t + 1] if wg == 0 else [t - 1, t]
            ops += [("S", t), ("softmax", t)] + [("PV", u) for u in pair if u < n_tiles]
        if n_tiles % 2 and wg == 1:
            ops.append(("PV", n_tiles - 1))        # an odd count: the last tile is warpgroup 0's alone
        progs[wg] = ops
    done, sched = {}, {"load": [], 0: [], 1: []}
    released = {t: set() for t in range(n_tiles)}
    wg_free, tc_free, pos = {0: 0, 1: 0}, 0, {0: 0, 1: 0}
    load_free, next_load = 0, 0
    dur = {"S": t_s, "softmax": t_soft, "PV": t_pv}
    while pos[0] < len(progs[0]) or pos[1] < len(progs[1]) or next_load < n_tiles:
        progressed = False
        # the producer: tile t into slot t % STAGES once tile t - STAGES was released by both warpgroups
        if next_load < n_tiles:
            prev = next_load - STAGES
            if prev < 0 or len(released[prev]) == 2:
                start = max(load_free, 0 if prev < 0 else max(done[("rel", prev, w)] for w in (0, 1)))
                sched["load"].append((start, t_load, "load", next_load))
                done[("load", next_load)] = load_free = start + t_load
                next_load += 1
                progressed = True
        candidates = []
        for wg in (0, 1):
            if pos[wg] >= len(progs[wg]):
                continue
            kind, t = progs[wg][pos[wg]]
            need = {"S": [("load", t)], "softmax": [("S", t)] + ([("softmax", t - 1)] if t else []),
                    "PV": [("softmax", t)]}[kind]
            if all(n in done for n in need):
                start = max([wg_free[wg]] + [done[n] for n in need] + ([tc_free] if kind != "softmax" else []))
                candidates.append((start, wg, kind, t))
        if candidates:
            start, wg, kind, t = min(candidates)
            end = start + dur[kind]
            sched[wg].append((start, dur[kind], kind, t))
            wg_free[wg] = end
            if kind != "softmax":
                tc_free = end
            done[(kind, t) if kind != "PV" else ("PV", t, wg)] = end
            if kind == "softmax":
                done[("softmax", t)] = end
            if kind == "S":
                done[("S", t)] = end
            if kind == "PV":  # this warpgroup is done with tile t's slot
                released[t].add(wg)
                done[("rel", t, wg)] = end
            pos[wg] += 1
            progressed = True
        if not progressed:
            raise RuntimeError("the ping-pong schedule deadlocked: the diagram no longer matches the kernel")
    return sched


@styled
def mla_pingpong_timeline(n_tiles: int = 6):
    """MLA's warp-specialized decode (attention_kernels/mla/gluon_decode.py) over time, for one CTA: the 1-warp
    producer copies cache tiles by TMA into a ring of STAGES slots; the two consumer warpgroups own
    alternate tiles (scores S = Q K^T and the online softmax for their own tile) and both add every
    tile's P V to their half of O. Durations are schematic, in proportion to the work of one tile
    (S: 576-wide product; P V: 256 columns each; the copy of 64 x 576 bf16 a little longer than a
    tile's products, as at large batch), not a measured trace."""
    from .gluon_decode import BLOCK_H, BN, D_QK, D_V, STAGES

    sched = _pingpong_schedule(n_tiles, t_load=7, t_s=4, t_soft=3, t_pv=2)
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 3.6))
    rows = [("load", "producer\n(1 warp, TMA)"), (0, "warpgroup 0\n(4 warps)"), (1, "warpgroup 1\n(4 warps)")]
    colors = {"load": C_SKIP, "S": C_WORK, "softmax": C_MASK, "PV": C_WORK2}
    for y, (key, _name) in enumerate(rows):
        for start, length, kind, t in sched[key]:
            face = colors[kind] if kind != "load" else [C_LIGHT, C_SKIP][t % STAGES]
            label = f"tile {t}\nslot {t % STAGES}" if kind == "load" else f"{t}"
            draw_box(ax, start, -y - 0.4, length, 0.8, label, face, fontsize=9.5,
                 text_color="white" if kind == "S" else C_TEXT)
    end = max(s + d for v in sched.values() for s, d, *_ in v)
    ax.set_xlim(0, end)
    ax.set_ylim(-len(rows) + 0.45, 0.55)
    ax.set_yticks([-y for y in range(len(rows))], [name for _, name in rows])
    ax.set_xticks([])
    ax.set_xlabel("time (schematic) →")
    ax.grid(False)
    legend = [Patch(color=C_WORK, label=f"S = Q Kᵀ ({BLOCK_H}×{BN}, {D_QK} wide)"),
              Patch(color=C_MASK, label="online softmax"),
              Patch(color=C_WORK2, label=f"O += P V (its {D_V // 2} columns)")]
    ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncols=3, fontsize=9.5,
              title="in each box: the tile number", title_fontsize=9.5)
    ax.set_title(f"MLA decode, one CTA ({BLOCK_H} heads, tiles of {BN} positions, {STAGES}-slot ring)", loc="left")
    return finish_figure(fig)


__all__ = ["split_kv_merge", "mla_pingpong_timeline"]
