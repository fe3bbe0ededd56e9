import os

# Intel MKL's results may differ in the last bit with the memory alignment of their inputs,
# which differs between processes; the tests compare losses of separate runs exactly (resume,
# ranks), so every process they start asks MKL for reproducible results.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")

import pytest
import torch


def pytest_collection_modifyitems(config, items):
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
