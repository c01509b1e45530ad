"""The page "In a model": its table of the peers' options (attention_kernels/compare/options.py) holds for
every entry, and the tiny-model training script runs (a few steps on the CPU, under the interpreter).

Each option is called as the table says: "refuses" raises a ValueError naming the keyword; "takes" runs
and returns finite outputs; "takes, no effect" returns the default call's outputs exactly.
"""
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention_kernels.compare.options import CALLS, NO_EFFECT, OPTIONS, REFUSES, TAKES, call_with, options_table

ROOT = Path(__file__).resolve().parents[1]


def _tensors(result):
    items = result if isinstance(result, (tuple, list)) else (result,)
    return [t for t in items if isinstance(t, torch.Tensor)]


def _id(option):
    return f"{option.call}-{option.name}-{option.status}"


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.status == REFUSES], ids=_id)
def test_refused_option_raises_naming_it(option):
    with pytest.raises(ValueError, match=option.name):
        call_with(option)


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.status == TAKES], ids=_id)
def test_taken_option_runs(option):
    outputs = _tensors(call_with(option))
    assert outputs and all(torch.isfinite(t.float()).all() for t in outputs)


@pytest.mark.parametrize("option", [o for o in OPTIONS if o.status == NO_EFFECT], ids=_id)
def test_option_without_effect_gives_the_default_answer(option):
    got, want = _tensors(call_with(option)), _tensors(call_with(None, option.call))
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))


def test_every_call_has_options_and_the_table_a_row_each():
    assert {o.call for o in OPTIONS} == set(CALLS)
    assert {o.status for o in OPTIONS} <= {TAKES, REFUSES, NO_EFFECT}
    table = options_table()
    assert list(table.index) == list(dict.fromkeys(o.call for o in OPTIONS))
    assert "dropout_p" in table.loc["flash_attn_func", REFUSES]


def test_train_tiny_runs_a_few_steps_and_writes_its_results(tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "KERNELS_RESULTS_DIR": str(tmp_path)}
    subprocess.run([sys.executable, str(ROOT / "scripts" / "train_tiny.py"), "--cpu", "--steps", "2",
                    "--families", "gla,softmax"], check=True, env=env, timeout=120, cwd=ROOT)
    from attention_kernels.compare.tiny import load_losses

    losses = load_losses(tmp_path)
    assert set(losses["family"]) == {"gla", "softmax"} and set(losses["step"]) == {0, 1}
    assert (losses["provider"] == "book").all()    # no peer on this machine: the book's rows alone
    assert all(math.isfinite(v) and v > 0 for v in losses["loss"])
    assert losses.attrs["meta"]["steps"] == 2
