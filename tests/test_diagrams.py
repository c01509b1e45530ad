"""The book's diagrams, each in its family's attention_kernels/<family>/diagram.py, drawn with attention_kernels/drawing.py:
each draws from the kernels' own numbers, at the width of the text column, and shows what it claims (a
rescale that happens, a mask on the diagonal, a merge that is exact)."""
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from attention_kernels.flash_attn import diagram as fa_diagram  # noqa: E402
from attention_kernels.gla import diagram as gla_diagram  # noqa: E402
from attention_kernels.mla import diagram as mla_diagram  # noqa: E402
from attention_kernels.primer import diagram as primer_diagram  # noqa: E402
from attention_kernels.plot import COLUMN_INCHES, COLUMN_PX, DPI  # noqa: E402

DIAGRAMS = [(fa_diagram, "fa_tiling"), (fa_diagram, "online_softmax_blocks"), (mla_diagram, "split_kv_merge"),
            (mla_diagram, "mla_pingpong_timeline"), (gla_diagram, "gla_chunks"), (primer_diagram, "primer_grid")]


@pytest.mark.parametrize("module, name", DIAGRAMS, ids=[name for _, name in DIAGRAMS])
def test_each_diagram_draws_at_the_column_width(module, name, tmp_path):
    before = dict(matplotlib.rcParams)
    fig = getattr(module, name)()
    assert isinstance(fig, Figure)
    assert fig.get_size_inches()[0] == pytest.approx(COLUMN_INCHES)
    assert fig.dpi == DPI
    fig.savefig(tmp_path / "d.png")  # draws every artist (a bad one fails here)
    width = plt.imread(tmp_path / "d.png").shape[1]
    assert width == COLUMN_PX
    assert not plt.get_fignums(), "a diagram left its figure open (the notebook would show it twice)"
    assert dict(matplotlib.rcParams) == before, "the house style leaked into matplotlib's settings"


def test_the_worked_example_rescales():
    rows = fa_diagram.online_softmax_table()
    x = fa_diagram.online_softmax_example()
    assert int(x.argmax()) >= fa_diagram.ONLINE_SOFTMAX_BLOCK        # the maximum is not in block 0
    assert rows[0]["alpha"] is None
    assert [r["rescaled"] for r in rows] == [False, True, True]
    for prev, r in zip(rows, rows[1:]):                              # l_new = l_old * alpha + this block's sum
        block_sum = torch.exp(torch.tensor(r["scores"], dtype=torch.float64) - r["m"]).sum().item()
        assert r["l"] == pytest.approx(prev["l"] * r["alpha"] + block_sum, rel=1e-12)
        assert r["alpha"] < 1.0


def test_fa_tiling_walks_what_the_kernel_walks():
    from attention_kernels.flash_attn.forward import FWD_TILES
    BM, BN = FWD_TILES[128][:2]
    # causal, square, block multiples: query block i reads i*BM/BN blocks unmasked and BM/BN on the diagonal
    full_end, hi = fa_diagram._key_ranges(2 * BM, 4 * BM, 4 * BM, BM, BN, True)
    assert (full_end, hi) == (2 * BM, 3 * BM)
    full_end, hi = fa_diagram._key_ranges(0, 600, 600, BM, BN, False)  # not causal: only the ragged end is masked
    assert (full_end, hi) == (600 // BN * BN, 600)
    legend = [t.get_text() for t in fa_diagram.fa_tiling(T=4 * BM, program=2).legends[0].get_texts()]
    assert legend[0].endswith(f"({2 * BM // BN} blocks)") and legend[1].endswith(f"({BM // BN})")


def test_pingpong_schedule_keeps_the_kernels_rules():
    from attention_kernels.mla.gluon_decode import STAGES
    sched = mla_diagram._pingpong_schedule(7, t_load=7, t_s=4, t_soft=3, t_pv=2)
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
    fig = primer_diagram.primer_grid(n=2600, block=1024)
    texts = [t.get_text() for t in fig.axes[0].texts]
    assert "masked" in texts and any("2048–2599" in t for t in texts)
    assert "3 programs" in fig.axes[0].get_xlabel()


def test_the_families_import_without_their_figures():
    """A family's figures need matplotlib only when drawn: importing the package and its families loads
    neither a diagram module nor matplotlib."""
    code = ("import sys, attention_kernels, attention_kernels.flash_attn, attention_kernels.mla, attention_kernels.gla, attention_kernels.primer, "
            "attention_kernels.lightning, attention_kernels.ring\n"
            "print(sorted(m for m in sys.modules\n"
            "             if m == 'matplotlib' or m.endswith(('.diagram', '.drawing'))))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == "[]", f"imported with the package: {done.stdout.strip()}"
