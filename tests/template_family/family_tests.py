"""The template family's tests (a family's tests/test_<family>.py): the
kernel against the reference at a shape that is not a block multiple, and one
bad input refused by name before any launch."""
import pytest
import torch

from attention_kernels.common import assert_close, tolerance
from attention_kernels.template import fused_recurrent_linear, linear_attention_ref


def test_fused_recurrent_matches_the_reference():
    q, k, v = (torch.randn(1, 3, 2, 20) for _ in range(3))
    S0 = torch.randn(1, 2, 20, 20)
    o, S = fused_recurrent_linear(q, k, v, initial_state=S0, output_final_state=True)
    o_ref, S_ref = linear_attention_ref(q.double(), k.double(), v.double(), initial_state=S0.double(),
                                        output_final_state=True)
    assert_close(o, o_ref, tolerance(torch.float32))
    assert_close(S, S_ref, tolerance(torch.float32), "final state")


def test_a_bad_state_is_refused_by_name():
    q = torch.randn(1, 3, 2, 20)
    with pytest.raises((TypeError, ValueError), match="initial_state"):
        fused_recurrent_linear(q, q, q, initial_state=torch.randn(1, 2, 20, 21))
