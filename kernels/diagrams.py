"""The book's diagrams, drawn by code from the kernels' own numbers, so that they stay true when a
kernel changes: tile sizes come from the kernels' modules, the online-softmax numbers from the
package's reference, the split-KV slice count from MLA's launch decision.

Each function draws one figure in the book's style (`kernels.plot`), the width of the text column,
and returns the matplotlib Figure (a notebook shows it as a PNG).

    >>> from kernels.diagrams import fa_tiling
    >>> fa_tiling()                      # the forward's tiles for D = 128, causal
"""
from __future__ import annotations

import math
import types

import matplotlib.pyplot as plt
import torch
from matplotlib.patches import FancyArrowPatch, Patch, Rectangle

from .plot import BOOK_BLUES, BOOK_MARKERS, COLUMN_INCHES, PEERS, column_figure, log2_axis, styled

# Roles in every diagram: the book's blues for work, orange for what the mask touches, greys for
# what is skipped or idle.
C_WORK, C_WORK2, C_LIGHT = BOOK_BLUES[0], BOOK_BLUES[1], BOOK_BLUES[4]
C_MASK = PEERS["SDPA flash"].color
C_SKIP = "#e6e6e6"
C_TEXT = "#222222"

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
    from .flash_attn.reference import online_softmax_steps

    x = online_softmax_example() if x is None else x
    steps, _ = online_softmax_steps(x, block)
    rows, m_old, l_old = [], None, 0.0
    for s in steps:
        alpha = None if m_old is None else math.exp(m_old - s["m"])
        rows.append({**s, "alpha": alpha, "old": 0.0 if alpha is None else l_old * alpha,
                     "rescaled": alpha is not None and s["m"] > m_old})
        m_old, l_old = s["m"], s["l"]
    return rows


def _box(ax, x, y, w, h, text="", color=C_LIGHT, edge=C_TEXT, fontsize=10, text_color=C_TEXT, **kw):
    ax.add_patch(Rectangle((x, y), w, h, facecolor=color, edgecolor=edge, lw=1.0, **kw))
    if text:
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=fontsize, color=text_color)


def _arrow(ax, start, end, text="", color=C_TEXT, fontsize=9.5, **kw):
    ax.add_patch(FancyArrowPatch(start, end, arrowstyle="-|>", mutation_scale=12, color=color, lw=1.2, **kw))
    if text:
        ax.text((start[0] + end[0]) / 2 + 0.05, (start[1] + end[1]) / 2, text, fontsize=fontsize, va="center",
                color=color)


def _finish(fig):
    plt.close(fig)  # shown once, as the cell's value
    return fig


# ---------------------------------------------------------------------------------- FlashAttention
def _key_ranges(m0, T, S, BM, BN, causal):
    """The forward kernel's own `_key_ranges`, evaluated in Python (tl.minimum/maximum as min/max)."""
    from .flash_attn import forward

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
    from .flash_attn.forward import FWD_TILES

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
    return _finish(fig)


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
    return _finish(fig)


# ---------------------------------------------------------------------------------- MLA
@styled
def split_kv_merge(n_splits: int = 4, length: int = 64, seed: int = 0):
    """Split-KV decode: each slice of one sequence's cache is one program, which writes a partial output
    o_s (normalised over its slice) and its log-sum-exp lse_s; the combine kernel merges them with the
    weights e^(lse_s - lse). The numbers are a small worked example (scalar values, `length` positions,
    computed here and checked against one softmax over the whole cache); the title gives the slice
    counts MLA's launch picks on an H200 (`kernels.mla.planning.num_splits`)."""
    from .mla.planning import PLAN_HEAD_BLOCK, PLAN_SM_COUNT, num_splits

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
        _box(ax, x0 + 0.01, 3.3, width - 0.02, 0.45, f"positions {a}–{b - 1}", BOOK_BLUES[k % 3],
             text_color="white" if k % 3 < 2 else C_TEXT)
        _arrow(ax, (x0 + width / 2, 3.28), (x0 + width / 2, 2.62))
        _box(ax, x0 + 0.02, 1.9, width - 0.04, 0.7, f"program {k}\no = {o_s[k]:+.3f}\nlse = {lse_s[k]:.3f}",
             "white")
        ax.text(x0 + width / 2, 1.72, f"w = {w[k]:.3f}", fontsize=10, ha="center", va="center", color=C_MASK,
                bbox=dict(facecolor="white", edgecolor="none", pad=1))
        _arrow(ax, (x0 + width / 2, 1.6), (0.5, 1.0))
    _box(ax, 0.18, 0.15, 0.64, 0.82,
         f"combine: lse = log Σ e^(lse_s) = {lse:.3f}\nw_s = e^(lse_s − lse),  o = Σ w_s o_s = {o:+.4f}\n"
         "(equal to one softmax over the whole cache)", C_LIGHT)
    ax.text(0.0, 3.95, "one sequence's cache, cut into slices", fontsize=10)
    ax.set_xlim(-0.01, 1.01)
    ax.set_ylim(0.0, 4.2)
    ax.axis("off")
    picks = ", ".join(f"B={b}: {num_splits(b, 128 // PLAN_HEAD_BLOCK, 16384, PLAN_SM_COUNT)}" for b in (1, 8, 32, 128))
    ax.set_title(f"Split-KV decode: one program per slice, merged by log-sum-exp\n"
                 f"(slices MLA's launch picks at T = 16K, H = 128: {picks})", loc="left")
    return _finish(fig)


def _pingpong_schedule(n_tiles: int, t_load: int, t_s: int, t_soft: int, t_pv: int):
    """Simulate the order of `gluon_decode._ws_consumer` and `_ws_load_partition` with unit durations:
    returns {row: [(start, length, kind, tile)]}. The tensor cores do one product at a time; a ring
    slot is refilled once both warpgroups have released its previous tile."""
    from .mla.gluon_decode import STAGES

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
    """MLA's warp-specialized decode (kernels/mla/gluon_decode.py) over time, for one CTA: the 1-warp
    producer copies cache tiles by TMA into a ring of STAGES slots; the two consumer warpgroups own
    alternate tiles (scores S = Q K^T and the online softmax for their own tile) and both add every
    tile's P V to their half of O. Durations are schematic, in proportion to the work of one tile
    (S: 576-wide product; P V: 256 columns each; the copy of 64 x 576 bf16 a little longer than a
    tile's products, as at large batch), not a measured trace."""
    from .mla.gluon_decode import BLOCK_H, BN, D_QK, D_V, STAGES

    sched = _pingpong_schedule(n_tiles, t_load=7, t_s=4, t_soft=3, t_pv=2)
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 3.6))
    rows = [("load", "producer\n(1 warp, TMA)"), (0, "warpgroup 0\n(4 warps)"), (1, "warpgroup 1\n(4 warps)")]
    colors = {"load": C_SKIP, "S": C_WORK, "softmax": C_MASK, "PV": C_WORK2}
    for y, (key, _name) in enumerate(rows):
        for start, length, kind, t in sched[key]:
            face = colors[kind] if kind != "load" else [C_LIGHT, C_SKIP][t % STAGES]
            label = f"tile {t}\nslot {t % STAGES}" if kind == "load" else f"{t}"
            _box(ax, start, -y - 0.4, length, 0.8, label, face, fontsize=9.5,
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
    return _finish(fig)


# ---------------------------------------------------------------------------------- GLA
@styled
def gla_chunks(n_chunks: int = 4):
    """GLA's chunk decomposition: the T x T causal matrix in chunks of CHUNK tokens (kernels.linear.chunk).
    The diagonal blocks are computed inside the chunk (a causal, decayed product of the chunk's own
    queries and keys); everything below them reaches the chunk through the state S_n, passed from chunk
    to chunk and decayed on the way."""
    from .linear.chunk import CHUNK

    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 5.8))
    n = n_chunks
    for i in range(n):
        for j in range(n):
            if j < i:
                _box(ax, j, -i - 1, 1, 1, "", C_LIGHT, edge="white")
            elif j == i:
                ax.add_patch(plt.Polygon([(j, -i), (j, -i - 1), (j + 1, -i - 1)], facecolor=C_WORK2,
                                         edgecolor="white"))
                ax.text(j + 0.3, -i - 0.72, "intra", color="white", fontsize=9.5, ha="center")
            else:
                _box(ax, j, -i - 1, 1, 1, "", "white", edge=C_SKIP)
    for i in range(1, n):
        ax.text(i / 2, -i - 0.5, f"through $S_{i}$", ha="center", va="center", fontsize=10)
    # the state pass, under the matrix: S_0 -> S_1 -> ... at the chunk boundaries
    y = -n - 0.75
    for k in range(n + 1):
        ax.add_patch(plt.Circle((k, y), 0.2, facecolor=C_WORK, edgecolor="none"))
        ax.text(k, y, f"$S_{k}$", color="white", ha="center", va="center", fontsize=10)
        if k < n:
            _arrow(ax, (k + 0.22, y), (k + 0.78, y))
            ax.text(k + 0.5, y - 0.38, f"chunk {k}", ha="center", fontsize=9.5)
    ax.text(n + 0.3, y + 0.05, "$S_{n+1} = \\mathrm{diag}(\\gamma_n) S_n + \\tilde K_n^\\top V_n$", fontsize=10,
            va="center")
    ax.text(n + 0.3, -0.5, f"{CHUNK} tokens\na chunk", fontsize=10, va="center")
    ax.text(n + 0.3, -1.9, "$O_n = \\tilde Q_n S_n$\n  $+ (\\tilde Q_n \\tilde K_n^\\top \\odot M) V_n$", fontsize=10.5,
            va="center")
    ax.set_xlim(-0.3, n + 2.9)
    ax.set_ylim(y - 0.65, 0.2)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.set_title(f"GLA in chunks of {CHUNK}: causal blocks inside a chunk, the rest through the state", loc="left")
    return _finish(fig)


# ---------------------------------------------------------------------------------- the primer
@styled
def primer_grid(n: int = 2600, block: int | None = None):
    """A vector of n elements in blocks of BLOCK (default: `vector_add`'s block), one program per block
    (the grid is cdiv(n, BLOCK)); the last program's offsets past n are masked off."""
    import inspect

    if block is None:
        from .primer.interface import vector_add
        block = inspect.signature(vector_add).parameters["block"].default
    programs = math.ceil(n / block)
    fig, ax = plt.subplots(figsize=(COLUMN_INCHES, 2.6))
    for p in range(programs):
        a = p * block
        live = min(block, n - a)
        _box(ax, a, 0, live, 1, f"program {p}\n{a}–{a + live - 1}", BOOK_BLUES[p % 2],
             text_color="white", edge="white")
        if live < block:
            _box(ax, a + live, 0, block - live, 1, "masked", C_SKIP, edge=C_TEXT, hatch="//")
    ax.annotate(f"n = {n}", xy=(n, 1.0), xytext=(n, 1.45), ha="center", arrowprops=dict(arrowstyle="-|>"))
    ax.set_xlim(0, programs * block)
    ax.set_ylim(-0.1, 1.8)
    ax.set_yticks([])
    ax.set_xticks([p * block for p in range(programs + 1)])
    ax.grid(False)
    ax.set_xlabel(f"element index (BLOCK = {block}, grid = cdiv({n}, {block}) = {programs} programs)")
    ax.set_title("offs = pid * BLOCK + tl.arange(0, BLOCK);  mask = offs < n", loc="left", family="monospace",
                 fontsize=10)
    return _finish(fig)


# ---------------------------------------------------------------- Lightning: why the state needs a decay
def lightning_state_norms(slopes, T_max: int = 16384, D: int = 16, seed: int = 0):
    """‖kv_T‖_F at T = 1, 2, 4, … T_max for one head per slope, on SiLU'd random q, k, v (as MiniMax
    feeds the attention: mostly positive, so the k v^T add up instead of cancelling). fp64.

    Returns (T values [n], norms [n, len(slopes)]).

        >>> Ts, norms = lightning_state_norms([0.0, 0.1], T_max=64)
    """
    from .lightning.reference import torch_lightning_step

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
    plt.close(fig)
    return fig


__all__ = ["fa_tiling", "online_softmax_blocks", "split_kv_merge", "mla_pingpong_timeline", "gla_chunks",
           "primer_grid", "online_softmax_example", "online_softmax_table", "ONLINE_SOFTMAX_EXAMPLE",
           "lightning_state_norms", "lightning_state_growth"]
