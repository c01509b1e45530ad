"""The book's diagrams (kernels/diagrams.py): each draws from the kernels' own numbers, at the width of the
text column, and shows what it claims (a rescale that happens, a mask on the diagonal, a merge that is exact)."""
import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from kernels import diagrams  # noqa: E402
from kernels.plot import COLUMN_INCHES, COLUMN_PX, DPI  # noqa: E402

NAMES = ["fa_tiling", "online_softmax_blocks", "split_kv_merge", "mla_pingpong_timeline", "gla_chunks", "primer_grid"]


@pytest.mark.parametrize("name", NAMES)
def test_each_diagram_draws_at_the_column_width(name, tmp_path):
    before = dict(matplotlib.rcParams)
    fig = getattr(diagrams, name)()
    assert isinstance(fig, Figure)
    assert fig.get_size_inches()[0] == pytest.approx(COLUMN_INCHES)
    assert fig.dpi == DPI
    fig.savefig(tmp_path / "d.png")  # draws every artist (a bad one fails here)
    width = plt.imread(tmp_path / "d.png").shape[1]
    assert width == COLUMN_PX
    assert not plt.get_fignums(), "a diagram left its figure open (the notebook would show it twice)"
    assert dict(matplotlib.rcParams) == before, "the house style leaked into matplotlib's settings"


def test_the_worked_example_rescales():
    rows = diagrams.online_softmax_table()
    x = diagrams.online_softmax_example()
    assert int(x.argmax()) >= diagrams.ONLINE_SOFTMAX_BLOCK        # the maximum is not in block 0
    assert rows[0]["alpha"] is None
    assert [r["rescaled"] for r in rows] == [False, True, True]
    for prev, r in zip(rows, rows[1:]):                              # l_new = l_old * alpha + this block's sum
        block_sum = torch.exp(torch.tensor(r["scores"], dtype=torch.float64) - r["m"]).sum().item()
        assert r["l"] == pytest.approx(prev["l"] * r["alpha"] + block_sum, rel=1e-12)
        assert r["alpha"] < 1.0


def test_fa_tiling_walks_what_the_kernel_walks():
    from kernels.flash_attn.forward import FWD_TILES
    BM, BN = FWD_TILES[128][:2]
    # causal, square, block multiples: query block i reads i*BM/BN blocks unmasked and BM/BN on the diagonal
    full_end, hi = diagrams._key_ranges(2 * BM, 4 * BM, 4 * BM, BM, BN, True)
    assert (full_end, hi) == (2 * BM, 3 * BM)
    full_end, hi = diagrams._key_ranges(0, 600, 600, BM, BN, False)  # not causal: only the ragged end is masked
    assert (full_end, hi) == (600 // BN * BN, 600)
    legend = [t.get_text() for t in diagrams.fa_tiling(T=4 * BM, program=2).legends[0].get_texts()]
    assert legend[0].endswith(f"({2 * BM // BN} blocks)") and legend[1].endswith(f"({BM // BN})")


def test_pingpong_schedule_keeps_the_kernels_rules():
    from kernels.mla.gluon_decode import STAGES
    sched = diagrams._pingpong_schedule(7, t_load=7, t_s=4, t_soft=3, t_pv=2)
    load_end = {t: s + d for s, d, _, t in sched["load"]}
    ends = {}
    for wg in (0, 1):
        for s, d, kind, t in sched[wg]:
            ends.setdefault((kind, t), []).append(s + d)
            if kind == "S":
                assert t % 2 == wg and s >= load_end[t]               # own tiles only, after their copy
    for wg in (0, 1):                                                # both warpgroups add every tile's P V
        assert sorted(t for _, _, kind, t in sched[wg] if kind == "PV") == list(range(7))
    for s, _, _, t in sched["load"]:                                 # a slot is refilled only when released
        if t >= STAGES:
            assert s >= max(ends[("PV", t - STAGES)])
    busy = sorted((s, s + d) for wg in (0, 1) for s, d, kind, _ in sched[wg] if kind != "softmax")
    assert all(a[1] <= b[0] for a, b in zip(busy, busy[1:])), "two products on the tensor cores at once"


def test_primer_grid_masks_only_the_tail():
    fig = diagrams.primer_grid(n=2600, block=1024)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "masked" in texts and any("2048–2599" in t for t in texts)
    assert "3 programs" in fig.axes[0].get_xlabel()
