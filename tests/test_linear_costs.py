"""attention_kernels.linear.costs: the linear families' cost model, counted again here by hand, and the numbers
its docstring quotes pinned to what it computes."""
import pytest

from attention_kernels.linear import costs
from attention_kernels.linear.chunk import CHUNK


def _chunk_flops_by_hand(T, K, V, C=CHUNK):
    """Per (batch, head): every chunk's matmuls, pair by pair on the causal triangle; a ragged last
    chunk is computed whole (padded), as the kernels do."""
    flops = 0
    for _ in range(0, T, C):
        pairs = sum(i + 1 for i in range(C))  # row i of the chunk sees i + 1 keys
        flops += pairs * 2 * K + pairs * 2 * V  # scores Q K^T and (scores) V on the triangle
        flops += 2 * C * K * V + 2 * C * K * V  # inter Q S and the state update K^T V
    return flops


@pytest.mark.parametrize("T", [1, 64, 100, 4096])
def test_chunk_flops_counts_the_matmuls(T):
    c = {"B": 2, "H": 3, "D": 128, "T": T}
    assert costs.chunk_flops(c) == 2 * 3 * _chunk_flops_by_hand(T, 128, 128)


def test_arithmetic_intensity_matches_the_docstring():
    """At K = V = 128: 82,176 FLOP a token against 1,024 bytes of q, k, v, o in bf16 (80 FLOP/byte),
    and 1,280 bytes with a gate per channel (64 FLOP/byte), as chunk_flops' docstring says."""
    c = {"B": 1, "H": 1, "D": 128, "T": CHUNK}
    per_token = costs.chunk_flops(c) / CHUNK
    bytes_4, bytes_5 = (costs.prefill_bytes(n)(c) / CHUNK for n in (4, 5))
    assert (per_token, bytes_4, bytes_5) == (82_176, 1_024, 1_280)
    doc = " ".join(costs.chunk_flops.__doc__.split())
    assert f"{per_token:,.0f} FLOP a token against {bytes_4:,.0f} bytes" in doc
    assert f"{round(per_token / bytes_4)} FLOP per byte ({round(per_token / bytes_5)} with a gate" in doc
    assert f"{costs.chunk_flops(c) / 1e6:.1f} MFLOP per chunk" in doc


def test_softmax_decode_counts_the_kv_heads_read():
    """The cache read counts the KV heads the case names (HKV), each once, not the query heads; the
    work stays one query per query head. Without HKV every query head has its own KV head."""
    grouped = {"B": 2, "H": 32, "HKV": 8, "T": 1000, "D": 128}
    per_head = {k: v for k, v in grouped.items() if k != "HKV"}
    assert costs.softmax_decode_bytes(grouped) == 2 * 2 * 8 * 1000 * 128 * 2
    assert costs.softmax_decode_bytes(per_head) == 4 * costs.softmax_decode_bytes(grouped)
    assert costs.softmax_decode_flops(grouped) == costs.softmax_decode_flops(per_head) == 4 * 2 * 32 * 1000 * 128


@pytest.mark.parametrize("hkv", [0, 5, 64])
def test_kv_heads_must_divide_the_query_heads(hkv):
    with pytest.raises(ValueError, match="HKV"):
        costs.kv_heads({"B": 1, "H": 32, "HKV": hkv, "T": 8, "D": 128})


def test_declared_softmax_baselines_state_their_kv_heads():
    """The decode-against-context tables compare against grouped softmax: Lightning's at MiniMax-01's
    8:1 (4 KV heads for 32 query heads), GLA's at LLaMA-3 8B's 4:1 (8 for 32)."""
    from attention_kernels.gla import bench as gla_bench
    from attention_kernels.lightning import bench as lightning_bench

    for bench, hkv in ((lightning_bench, 4), (gla_bench, 8)):
        cases = bench.CONTEXT_SOFTMAX.cases
        assert cases and all(costs.kv_heads(c) == hkv and c["H"] == 32 for c in cases)


@pytest.mark.parametrize("family, peer", [("gla", "fla chunk_gla"), ("lightning", "fla chunk_simple_gla"),
                                          ("kda", "fla chunk_kda")])
def test_packed_tables_time_the_packed_call_against_padding_and_fla(family, peer, monkeypatch):
    """Each linear family's packed table: the training step on the FlashAttention chapter's length mix (16K tokens
    of `packed_lengths`, seed 0) at H = 32, D = 128, as the packed call, the same sequences padded to the longest
    (N rows of T_max, no offsets) and fla's packed call; its work is the TRAIN table's, summed sequence by
    sequence (the padding counts nothing)."""
    import importlib

    from attention_kernels.flash_attn import bench as fa_bench
    from attention_kernels.flash_attn.bench import packed_lengths

    bench = importlib.import_module(f"attention_kernels.{family}.bench")
    table = bench.PACKED
    assert table.name == f"{family}_packed" and table in bench.BENCHMARKS
    assert list(table.providers) == ["book: packed", "book: padded", peer]
    assert table.timer == bench.TRAIN.timer == "flushed"
    lengths = packed_lengths(16384, seed=0)
    [case] = table.cases
    assert case == {"B": len(lengths), "T": 16384, "H": 32, "D": 128, "seed": 0}

    one = lambda n: {"B": 1, "T": n, "H": 32, "D": 128}   # noqa: E731
    assert table.flops(case) == sum(bench.TRAIN.flops(one(n)) for n in lengths)
    assert table.bytes_moved(case) == sum(bench.TRAIN.bytes_moved(one(n)) for n in lengths)
    padded = {"B": len(lengths), "T": max(lengths), "H": 32, "D": 128}
    assert table.flops(case) < bench.TRAIN.flops(padded)   # what padding adds is not counted

    # the shapes each provider is handed: one packed row with its offsets, or the padded batch without
    seen = []
    monkeypatch.setattr(costs, "cu_seqlens", lambda lengths, device=None: fa_bench.cu_seqlens(lengths))
    costs.packed(lambda c, cu: seen.append((c, cu.tolist())))(case)
    costs.padded(lambda c, cu_seqlens=None: seen.append((c, cu_seqlens)))(case)
    assert seen == [({**case, "B": 1}, fa_bench.cu_seqlens(lengths).tolist()), ({**case, **padded}, None)]
