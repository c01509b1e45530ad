import os

import pytest
import torch

import attention_kernels  # noqa: F401  (sets TRITON_INTERPRET=1 on a CPU before Triton is imported)

# A family to copy (tests/test_adding_a_family.py copies it into a copy of the book), not tests to run here:
# its chapter would otherwise be collected by `pytest --nbval`.
collect_ignore = ["template_family"]


def pytest_configure(config):
    config.addinivalue_line("markers", "gpu: needs a CUDA GPU (bf16, real shapes); skipped under the interpreter")
    config.addinivalue_line("markers", "site: builds the site and checks it in a browser")
    config.addinivalue_line("markers", "gpu_heavy: a GPU test whose fp32 reference takes gigabytes; such tests "
                                       "run one at a time across pytest-xdist's workers")


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


@pytest.fixture(autouse=True)
def _gpu_memory(request, tmp_path_factory):
    """Eight workers share one card: a GPU test hands its cached blocks back when it ends, and the gpu_heavy
    ones (fp32 score matrices of 2 GiB a head group) hold a lock while they run, one file for the session's
    workers, so that no two of them fill an 80 GB card together."""
    if request.node.get_closest_marker("gpu") is None or not torch.cuda.is_available():
        yield
        return
    lock = None
    if request.node.get_closest_marker("gpu_heavy") is not None:
        import fcntl   # POSIX only, as the GPU machines the suite runs on
        lock = os.open(tmp_path_factory.getbasetemp().parent / "gpu_heavy.lock", os.O_RDWR | os.O_CREAT)
        fcntl.flock(lock, fcntl.LOCK_EX)
    try:
        yield
    finally:
        try:
            torch.cuda.empty_cache()
        finally:
            if lock is not None:
                os.close(lock)      # and with it the lock


def pytest_terminal_summary(terminalreporter):
    """The declared tables no GPU run has measured yet: the chapters show one line for each of them
    until one does. Listed, not failed on."""
    from attention_kernels.bench import measure_commands, unmeasured

    names = unmeasured()
    if names:
        terminalreporter.write_sep("-", f"{len(names)} table(s) not measured yet on a GPU")
        terminalreporter.write_line(", ".join(names))
        terminalreporter.write_line("measure them: " + "; ".join(measure_commands(names)))
