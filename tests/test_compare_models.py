"""The model-shapes module: bytes of cache and state per token and per sequence, pinned by hand
arithmetic for every published configuration, and the hybrid-stack model."""
import pytest

from attention_kernels.compare import models
from attention_kernels.compare.models import (MODELS, Layer, kv_cache_bytes_per_token, linear_state_bytes,
                                    mamba2_state_bytes, mla_cache_bytes_per_token, ratio_stack, shapes_table,
                                    stack_bytes, stack_time)


def test_the_per_layer_formulas():
    assert kv_cache_bytes_per_token(8, 128) == 2 * 8 * 128 * 2 == 4096
    assert mla_cache_bytes_per_token() == 576 * 2 == 1152
    assert linear_state_bytes(64, 128, 128) == 64 * 128 * 128 * 4 == 4 * 2 ** 20
    # Mamba-2 2.7B: 80 x 64 x 128 fp32, plus 3 past inputs of 5120 + 2 x 128 channels in bf16
    assert mamba2_state_bytes(80, 64, 128, 1, 4) == 2_621_440 + 3 * 5376 * 2 == 2_653_696


@pytest.mark.parametrize("name, per_token, state, layers", [
    ("LLaMA-3-8B", 32 * 4096, 0, 32),                                       # 128 KiB a token
    ("DeepSeek-V3", 61 * 1152, 0, 61),                                      # 70,272 bytes
    ("Kimi Linear 48B", 7 * 1152, 20 * (2 * 2 ** 20 + 3 * 3 * 4096 * 2), 27),  # KDA state + q, k, v conv
    ("MiniMax-01", 10 * 4096, 70 * 4 * 2 ** 20, 80),                         # 280 MiB of Lightning state
    ("Mamba-2 2.7B", 0, 64 * 2_653_696, 64),
    ("Nemotron-H 8B", 4 * 4096, 24 * (128 * 64 * 128 * 4 + 3 * (8192 + 2 * 8 * 128) * 2), 52),
])
def test_each_model_by_hand(name, per_token, state, layers):
    m = MODELS[name]
    assert m.cache_bytes_per_token() == per_token
    assert m.state_bytes() == state
    assert m.layers == layers
    assert m.bytes_per_sequence(131072) == 131072 * per_token + state
    assert m.source.startswith("https://")


def test_a_fixed_state_does_not_grow_with_the_context():
    m = MODELS["Mamba-2 2.7B"]
    assert m.bytes_per_sequence(1024) == m.bytes_per_sequence(1 << 20) == m.state_bytes()
    assert MODELS["LLaMA-3-8B"].bytes_per_sequence(0) == 0


def test_the_table_holds_the_same_numbers():
    table = shapes_table(contexts=(131072,))
    assert table.loc["LLaMA-3-8B", "KiB / token"] == 128
    assert table.loc["LLaMA-3-8B", "GiB at 128K"] == 16
    assert table.loc["MiniMax-01", "state MiB"] == 280
    assert table.loc["Kimi Linear 48B", "attention layers"] == "20 KDA + 7 MLA"
    assert list(table.index) == list(MODELS)


def test_stack_time_sums_count_times_layer_time():
    kimi = MODELS["Kimi Linear 48B"].stack
    assert stack_time(kimi, {"KDA": 0.01, "MLA": 0.05}) == pytest.approx(20 * 0.01 + 7 * 0.05)
    with pytest.raises(ValueError, match="MLA"):
        stack_time(kimi, {"KDA": 0.01})


def test_ratio_stack_rebuilds_the_published_mixes():
    lin, soft = models.MINIMAX_LIGHTNING, models.MINIMAX_GQA
    assert ratio_stack(lin, soft, 7, 80) == ((lin, 70), (soft, 10))
    assert ratio_stack(models.KIMI_KDA, models.KIMI_MLA, 3, 27) == ((models.KIMI_KDA, 20), (models.KIMI_MLA, 7))
    assert ratio_stack(lin, soft, 0, 80) == ((soft, 80),)
    assert ratio_stack(lin, soft, None, 80) == ((lin, 80),)
    assert stack_bytes(ratio_stack(lin, soft, 7, 80), 1024, batch=2) == 2 * MODELS["MiniMax-01"].bytes_per_sequence(1024)
    with pytest.raises(ValueError, match="linear_per_softmax"):
        ratio_stack(lin, soft, -1, 80)


def test_a_layer_of_an_unknown_kind_is_refused():
    with pytest.raises(ValueError, match="kind"):
        Layer("softmax", heads=8, head_dim=64)


def _decode_table():
    import pandas as pd
    rows = [("GQA", 64, 16384, 0.30), ("GQA", 64, 16384, 0.20), ("MLA", 64, 16384, 0.50), ("KDA", 64, 4096, 0.04),
            ("Lightning", 64, 4096, 0.05), ("Mamba-2", 64, 4096, float("nan"))]
    return pd.DataFrame(rows, columns=["layer", "B", "T", "ms"])


def test_the_hybrid_model_takes_the_fastest_step_of_each_layer():
    from attention_kernels.compare.hybrid import hybrid_case, layer_times

    times = layer_times(_decode_table(), 64, 16384)
    assert times == {"GQA": 0.20, "MLA": 0.50, "KDA": 0.04, "Lightning": 0.05}   # Mamba-2 unmeasured: left out
    kimi = hybrid_case(_decode_table(), "Kimi Linear", 3, 16384, 64)
    assert kimi["stack"] == "20 KDA + 7 MLA"
    assert kimi["step ms"] == pytest.approx(20 * 0.04 + 7 * 0.50)
    assert kimi["GiB"] * 2 ** 30 == 64 * MODELS["Kimi Linear 48B"].bytes_per_sequence(16384)
    nemotron = hybrid_case(_decode_table(), "Nemotron-H 8B", 6, 16384, 64)
    assert nemotron["stack"] == "24 Mamba-2 + 4 GQA" and nemotron["step ms"] != nemotron["step ms"]  # NaN


def test_the_hybrid_table_on_an_unmeasured_decode_table():
    from attention_kernels.bench import not_measured
    from attention_kernels.compare import bench as compare_bench
    from attention_kernels.compare.hybrid import hybrid_table

    table = hybrid_table(not_measured(compare_bench.DECODE))
    assert table["step ms"].isna().all() and (table["GiB"] > 0).all()
    minimax = table.loc[("MiniMax-01", "7 : 1", 16384, 1), "GiB"]
    assert minimax * 2 ** 30 == MODELS["MiniMax-01"].bytes_per_sequence(16384)


def _context_table():
    """GQA's step 0.1, 0.4, 1.6 ms at 4K, 16K, 64K (fourfold a fourfold context), MLA's 0.01, 0.04, 0.16; KDA's
    fixed step 0.05 ms, timed at 4K only."""
    import pandas as pd
    rows = [("GQA", 64, T, ms) for T, ms in ((4096, 0.1), (16384, 0.4), (65536, 1.6))] \
        + [("MLA", 64, T, ms) for T, ms in ((4096, 0.01), (16384, 0.04), (65536, 0.16))] + [("KDA", 64, 4096, 0.05)]
    return pd.DataFrame(rows, columns=["layer", "B", "T", "ms"])


def test_a_decode_step_against_the_context():
    from attention_kernels.compare.hybrid import step_against_context, time_crossovers

    steps = step_against_context(_context_table())
    assert list(steps.index) == [(64, 4096), (64, 16384), (64, 65536)]
    assert steps["KDA"].tolist() == pytest.approx([50, 50, 50])        # the fixed state's one time, in µs
    assert steps["GQA"].tolist() == pytest.approx([100, 400, 1600])
    crossings = time_crossovers(_context_table())
    kda = models.layer_label("KDA")
    # GQA is slower from the shortest context; MLA's step is linear in T on log-log axes, 10 µs at 4K and 40 at
    # 16K, so it reaches KDA's 50 µs at 4K · 5 = 20K (between 16K and 64K)
    assert crossings.loc[kda, (64, models.layer_label("GQA"))] == "< 4K"
    assert crossings.loc[kda, (64, models.layer_label("MLA"))] == "≈ 20K"
    slow = _context_table().assign(ms=lambda d: d["ms"].where(d["layer"] != "KDA", 10.0))
    assert time_crossovers(slow).loc[kda, (64, models.layer_label("MLA"))] == "> 64K"
    # a layer with no time at a batch: no crossing is claimed there
    import pandas as pd
    other_batch = pd.concat([_context_table(), pd.DataFrame([("GQA", 1, 4096, 0.02)], columns=["layer", "B", "T", "ms"])])
    crossings = time_crossovers(other_batch)
    assert crossings.loc[kda, (1, models.layer_label("GQA"))] == "not timed"      # KDA untimed at B = 1
    assert crossings.loc[kda, (1, models.layer_label("MLA"))] == "not timed"      # MLA untimed at B = 1


def test_the_step_figure_waits_for_its_table():
    from attention_kernels.bench import not_measured
    from attention_kernels.compare import bench as compare_bench
    from attention_kernels.compare.hybrid import plot_step_against_context

    assert plot_step_against_context(not_measured(compare_bench.DECODE)) is None
    fig = plot_step_against_context(_context_table())
    assert len(fig.axes) == 1 and len(fig.axes[0].lines) == 3


def test_one_layers_memory_against_the_context():
    """One sequence in one layer at the decode table's shapes: LLaMA-3-8B's GQA cache adds 4 KiB a token
    (4 MiB at 1K, 4 GiB at 1M); MiniMax-01's Lightning state is 4 MiB at both. The figure draws the same
    values, in MiB."""
    from attention_kernels.compare.hybrid import plot_layer_memory

    memory = models.layer_memory((1024, 1 << 20))
    assert memory.loc[1024, "GQA"] == 4 * 2 ** 20 and memory.loc[1 << 20, "GQA"] == 4 * 2 ** 30
    assert memory.loc[1024, "Lightning"] == memory.loc[1 << 20, "Lightning"] == 64 * 128 * 128 * 4 == 4 * 2 ** 20
    fig = plot_layer_memory((1024, 1 << 20))
    lines = {line.get_label(): list(line.get_ydata()) for line in fig.axes[0].get_lines()}
    assert lines["GQA, LLaMA-3-8B (cache)"] == [4, 4096]
    assert lines["Lightning, MiniMax-01 (state)"] == [4, 4]
    assert len(lines) == len(models.LAYERS)


def test_where_a_cache_passes_a_fixed_state():
    """state bytes / cache bytes per token: LLaMA-3-8B's cache passes MiniMax-01's 4 MiB Lightning state at
    1K tokens, DeepSeek-V3's latent cache passes Kimi Linear's KDA state (2 MiB and its convolutions' last
    inputs) at 1884. Every crossing lies below the decode table's shortest context, 4K, and the GQA cache's
    at or below 1K (as the chapter reads the figure)."""
    from attention_kernels.compare import bench as compare_bench

    assert models.memory_crossover(models.LLAMA3_GQA, models.MINIMAX_LIGHTNING) == 1024
    assert models.memory_crossover(models.DEEPSEEK_MLA, models.KIMI_KDA) == pytest.approx(
        (2 * 2 ** 20 + 3 * 3 * 32 * 128 * 2) / 1152)
    table = models.memory_crossovers()
    assert table.loc["KDA, Kimi Linear 48B", "MLA, DeepSeek-V3"] == 1884
    assert list(table.index) == ["GLA, 32 heads of 128", "Lightning, MiniMax-01", "KDA, Kimi Linear 48B",
                                 "Mamba-2 2.7B"]
    assert (table.to_numpy() < min(compare_bench.DECODE_T)).all()
    assert (table["GQA, LLaMA-3-8B"] <= 1024).all()
    with pytest.raises(ValueError, match="cache layer"):
        models.memory_crossover(models.KIMI_KDA, models.LLAMA3_GQA)


def test_the_prefill_table_loads_whatever_providers_it_was_measured_with():
    """The GQA rows declare SDPA's cuDNN backend, as the training table does; a committed table holds only
    the providers its run timed, and loads as it is (no column is made up for a declared provider)."""
    from attention_kernels.bench import run, summary
    from attention_kernels.compare import bench as compare_bench

    assert {"SDPA flash", "SDPA cuDNN", "FlexAttention", "FA4"} <= set(compare_bench.PREFILL.providers)
    assert compare_bench.PREFILL_PEERS["SDPA cuDNN"]["GQA"] is compare_bench.fa_bench.GQA.providers["SDPA cuDNN"]
    prefill = run(compare_bench.PREFILL)
    assert set(prefill["provider"]) <= set(compare_bench.PREFILL.providers)
    if len(prefill):
        table = summary(prefill.assign(tokens_per_s=prefill["T"] / prefill["ms"] * 1e3),
                        index=["layer", "T"], values="tokens_per_s", digits=0)
        assert table is not None and len(table) == len(compare_bench.PREFILL.cases)
