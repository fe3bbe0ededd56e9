import atexit
import os
import shutil
import tempfile

# Intel MKL's results may differ in the last bit with the memory alignment of their inputs,
# which differs between processes; the tests compare losses of separate runs exactly (resume,
# ranks), so every process they start asks MKL for reproducible results.
os.environ.setdefault("MKL_CBWR", "AUTO,STRICT")
# A run on the CPU computes with the cores it finds idle (hardware/cpu.py), so a busy machine
# would change a test's thread count and with it the rounding of its numbers. The suite pins
# the count for itself and every process it starts: OMP_NUM_THREADS, one unless set. Ranks under
# torchrun compute with one thread each whatever it is (tests.cli_runs.torchrun).
os.environ.setdefault("OMP_NUM_THREADS", "1")
# Inductor's on-disk cache does not tell kernels compiled for one CPU capability from another's:
# kernels written while ATEN_CPU_CAPABILITY held the CPU to AVX2 corrupt the heap of a later
# process that is not held (glibc aborts). The suite compiles into a directory of its own,
# shared with the processes it starts and removed at its end.
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="tuneforge-tests-inductor-")
    atexit.register(shutil.rmtree, os.environ["TORCHINDUCTOR_CACHE_DIR"], ignore_errors=True)

from pathlib import Path

import pytest
import torch

TESTS = Path(__file__).parent
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


def pytest_collection_modifyitems(config, items):
    """Tests under gpu/ are `gpu` (skipped without CUDA); tests under integration/ are `slow`
    (end-to-end runs in subprocesses), as are the unit tests marked so (compilation, child
    processes): `pytest -m "not slow"` is the quick loop."""
    skip_gpu = pytest.mark.skip(reason="needs a CUDA device")
    for item in items:
        folder = Path(str(item.fspath)).relative_to(TESTS).parts[0]
        if folder == "gpu":
            item.add_marker(pytest.mark.gpu)
        if folder == "integration":
            item.add_marker(pytest.mark.slow)
        if "gpu" in item.keywords and not torch.cuda.is_available():
            item.add_marker(skip_gpu)
