"""Mamba-2 (Dao & Gu 2024): a state-space layer with one scalar decay per head.

    selective_state_update   the decode step, one Triton kernel, the state updated in place (mamba_ssm's name)
    ssd_chunk_scan           the SSD chunk scan for prefill and training (packed sequences too), on the
                             shared chunk machinery and its backward
    mamba_chunk_scan_combined  mamba_ssm's call on the scan (seq_idx, dt_limit, the per-sequence states),
                             onto ssd_chunk_scan (compat.py)
    mamba2_step              the step in PyTorch (pure); selective_state_update_ref, the same in place
    ssd_scan_ref             a step-by-step loop over a prompt (the scan's reference)
    ssd_chunked_torch        the SSD chunk form in PyTorch ops (the paper's minimal listing, rewritten)
    mamba1_step              Mamba-1's step, the predecessor (A per channel and state)
"""
from .compat import mamba_chunk_scan_combined
from .interface import selective_state_update, ssd_chunk_scan
from .reference import (mamba1_step, mamba2_step, segsum, selective_state_update_ref, ssd_chunked_torch,
                        ssd_scan_ref)

__all__ = ["selective_state_update", "ssd_chunk_scan", "mamba_chunk_scan_combined", "mamba2_step",
           "selective_state_update_ref", "ssd_scan_ref", "ssd_chunked_torch", "segsum", "mamba1_step"]
