"""The cost models of the MLA, KDA and Mamba-2 benchmarks (the FLOPs and bytes behind their roofline columns),
counted again here by hand from their docstrings' formulas, and the ratio the MLA chapter states pinned to
what MLA's model computes."""
import json
import re
from pathlib import Path

import pytest

from attention_kernels.kda import bench as kda_bench
from attention_kernels.mamba2 import bench as mamba2_bench
from attention_kernels.mla import bench as mla_bench

ROOT = Path(__file__).resolve().parents[1]
C = 64  # the chunk every chunked cost model counts in (attention_kernels.linear.chunk.CHUNK)


# ---------------------------------------------------------------------------------------------------- MLA
def test_mla_decode_flops_counts_score_and_value_products():
    """2·B·H·T·(576 + 512): per batch element, head and cached token, the score q·[c; k^R] (576 multiply-adds)
    and the value product p·c (512). B = 2, H = 128, T = 10: 2·2·128·10·1088 = 5,570,560."""
    assert mla_bench.decode_flops({"B": 2, "H": 128, "T": 10, "D": 576}) == 5_570_560
    # one head, one cached token: 2·(576 + 512)
    assert mla_bench.decode_flops({"B": 1, "H": 1, "T": 1, "D": 576}) == 2_176


def test_mla_decode_bytes_reads_the_latent_cache_once():
    """bf16 (2 bytes): the latent cache B·T·576 read once (shared by every head), q B·H·576 in, out B·H·512.
    B = 2, T = 10, H = 128: 2·(11,520 + 147,456 + 131,072) = 580,096."""
    assert mla_bench.decode_bytes({"B": 2, "H": 128, "T": 10, "D": 576}) == 580_096
    # the cache term does not grow with the heads: 128 heads add q and out only, 127·(576 + 512)·2 bytes each
    one_head, all_heads = (mla_bench.decode_bytes({"B": 1, "H": h, "T": 4096, "D": 576}) for h in (1, 128))
    assert all_heads - one_head == 127 * (576 + 512) * 2


def test_mla_absorbed_decode_does_the_chapter_s_multiple_of_mha_work():
    """The chapter (book/mla.ipynb, sections 1, 3 and 9): per head and cached token the absorbed decode does
    2·(576 + 512) = 2,176 FLOPs, MHA over the decompressed keys (128 + 64 = 192 a head) and values (128)
    2·(192 + 128) = 640, 3.4 times fewer. The cost model gives the first; every such multiple the chapter
    states is that ratio."""
    absorbed = mla_bench.decode_flops({"B": 1, "H": 1, "T": 1, "D": mla_bench.D_QK})
    unabsorbed = 2 * ((mla_bench.D_NOPE + mla_bench.D_R) + mla_bench.D_V)
    assert (absorbed, unabsorbed) == (2 * (576 + 512), 2 * (192 + 128))
    ratio = absorbed / unabsorbed
    assert ratio == pytest.approx(3.4)

    cells = json.loads((ROOT / "book" / "mla.ipynb").read_text())["cells"]
    text = " ".join(" ".join("".join(c["source"]).split()) for c in cells if c["cell_type"] == "markdown")
    assert "2\\,(576 + 512) = " + f"{absorbed:,.0f}".replace(",", "{,}") in text
    assert f"2\\,(192 + 128) = {unabsorbed}$, {ratio:.1f} times fewer" in text
    stated = re.findall(r"(\d+(?:\.\d+)?) times (?:the FLOPs|fewer)", text)
    assert len(stated) >= 3 and set(stated) == {f"{ratio:.1f}"}, stated


# ---------------------------------------------------------------------------------------------------- KDA
def _kda_prefill_by_hand(T, K, V):
    """Per (batch, head), chunk by chunk (a ragged last chunk counted whole, padded): GLA's matmuls, then
    KDA's own from prefill_flops' docstring."""
    flops = 0
    for _ in range(0, T, C):
        pairs = C * (C + 1) // 2                     # the causal triangle: row i sees i + 1 keys
        flops += pairs * 2 * K + pairs * 2 * V      # GLA: scores Q K^T and (scores) V on the triangle
        flops += 2 * C * K * V + 2 * C * K * V      # GLA: inter Q S and the state update K^T V
        flops += pairs * 2 * K                      # KDA: key-key scores on the triangle, C(C+1)·K
        flops += 2 * C * C * K + 2 * C * C * V      # KDA: W = X K and Ũ = X V, X the C x C inverse
        flops += 2 * C * K * V                      # KDA: W S
    return flops


@pytest.mark.parametrize("T", [1, 64, 100, 256])
@pytest.mark.parametrize("D", [64, 128])
def test_kda_prefill_and_train_flops(T, D):
    c = {"B": 2, "H": 3, "D": D, "T": T}
    assert kda_bench.prefill_flops(c) == 2 * 3 * _kda_prefill_by_hand(T, D, D)
    # a training step: forward + backward, the backward's matmuls twice the forward's
    assert kda_bench.train_flops(c) == 3 * 2 * 3 * _kda_prefill_by_hand(T, D, D)


def test_kda_prefill_flops_one_chunk_in_numbers():
    """One chunk, one head, K = V = 128: GLA's 64·65·256 + 4·64·128² = 5,259,264, KDA's own 64·65·128
    + 2·64²·256 + 2·64·128² = 532,480 + 2,097,152 + 2,097,152 = 4,726,784: 9,986,048 in all."""
    assert kda_bench.prefill_flops({"B": 1, "H": 1, "D": 128, "T": 64}) == 9_986_048
    assert kda_bench.train_flops({"B": 1, "H": 1, "D": 128, "T": 64}) == 3 * 9_986_048


def test_kda_decode_flops():
    """About 7·K·V a step per (batch, head): decay K·V, prediction 2·K·V, correction 2·K·V, read-out 2·K·V.
    B = 2, H = 3, D = 8: 7·2·3·64 = 2,688."""
    assert kda_bench.decode_flops({"B": 2, "H": 3, "D": 8}) == 2_688


def test_kda_tables_use_these_models():
    assert kda_bench.PREFILL.flops is kda_bench.prefill_flops
    assert kda_bench.TRAIN.flops is kda_bench.train_flops


# ---------------------------------------------------------------------------------------------------- Mamba-2
def test_mamba2_step_flops_and_bytes():
    """step_flops: about 6 FLOPs per (batch, head, headdim row, state entry). B = 2, H = 3, D = 4, dstate = 5:
    6·2·3·4·5 = 720.
    step_bytes: the fp32 state [B, H, D, dstate] read and written, 2·120·4 = 960; x, z, y bf16 [B, H, D],
    3·24·2 = 144; B and C bf16 [B, G, dstate], 2·(2·G·5)·2 = 40·G; dt bf16 [B, H], 6·2 = 12.
    G = 1: 1,156; G = 3: 1,236."""
    c = {"B": 2, "H": 3, "D": 4, "dstate": 5, "G": 1}
    assert mamba2_bench.step_flops(c) == 720
    assert mamba2_bench.step_bytes(c) == 1_156
    assert mamba2_bench.step_bytes({**c, "G": 3}) == 1_236
    assert mamba2_bench.step_flops({**c, "G": 3}) == 720    # the groups change the bytes, not the work


def _mamba2_prefill_by_hand(T, P, N):
    """Per (batch, head), chunk by chunk (a ragged last chunk counted whole): prefill_flops' docstring."""
    flops = 0
    for _ in range(0, T, C):
        pairs = C * (C + 1) // 2
        flops += pairs * 2 * N                      # C B^T on the causal triangle, C(C+1)·dstate
        flops += pairs * 2 * P                      # (L ∘ C B^T) X on it, C(C+1)·D
        flops += 2 * C * N * P                      # C S_start
        flops += 2 * C * N * P                      # the chunk state B^T X
    return flops


@pytest.mark.parametrize("T", [1, 64, 100, 256])
@pytest.mark.parametrize("G", [1, 3])
def test_mamba2_prefill_and_train_flops(T, G):
    """Counted per head, also where heads share a group: G does not change it."""
    c = {"B": 2, "T": T, "H": 3, "D": 16, "dstate": 32, "G": G}
    assert mamba2_bench.prefill_flops(c) == 2 * 3 * _mamba2_prefill_by_hand(T, 16, 32)
    assert mamba2_bench.train_flops(c) == 3 * 2 * 3 * _mamba2_prefill_by_hand(T, 16, 32)


def test_mamba2_prefill_flops_one_chunk_in_numbers():
    """One chunk, one head, D = 64, dstate = 128: 64·65·(128 + 64) + 4·64·128·64 = 798,720 + 2,097,152."""
    c = {"B": 1, "T": 64, "H": 1, "D": 64, "dstate": 128, "G": 1}
    assert mamba2_bench.prefill_flops(c) == 2_895_872
    assert mamba2_bench.train_flops(c) == 3 * 2_895_872


def test_mamba2_prefill_and_train_bytes():
    """bf16, per token. Prefill: x, z, y [H·D] each, B and C [G·dstate] each, dt [H]. Training: the forward's
    x, z, B, C, dt read and y written, the backward's x, z, B, C, dt and dy read and dx, dz, dB, dC, ddt
    written: 8 of H·D, 6 of G·dstate, 3 of H. B = 2, T = 5, H = 3, D = 4, dstate = 6, G = 1:
    prefill 10·(36 + 12 + 3)·2 = 1,020; training 10·(96 + 36 + 9)·2 = 2,820."""
    c = {"B": 2, "T": 5, "H": 3, "D": 4, "dstate": 6, "G": 1}
    assert mamba2_bench.prefill_bytes(c) == 1_020
    assert mamba2_bench.train_bytes(c) == 2_820


def test_mamba2_tables_use_these_models():
    for table in (mamba2_bench.PREFILL, mamba2_bench.PREFILL_CHUNKS, mamba2_bench.LAYER):
        assert (table.flops, table.bytes_moved) == (mamba2_bench.prefill_flops, mamba2_bench.prefill_bytes)
    assert (mamba2_bench.TRAIN.flops, mamba2_bench.TRAIN.bytes_moved) == (mamba2_bench.train_flops,
                                                                          mamba2_bench.train_bytes)
    for table in (mamba2_bench.DECODE_PLAIN, mamba2_bench.DECODE_GRAPH):
        assert (table.flops, table.bytes_moved) == (mamba2_bench.step_flops, mamba2_bench.step_bytes)
