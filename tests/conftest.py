import pytest
import torch

import kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on a CPU before Triton is imported)


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (bf16, real shapes); skipped under the interpreter")
    config.addinivalue_line("markers", "site: builds the site and checks it in a browser")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU; this machine runs Triton's interpreter")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
