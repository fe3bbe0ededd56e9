"""`doctor env`'s checks of variables, mounts and GPUs that answer, without a GPU."""

import sys
from pathlib import Path

from tuneforge.doctor import env_checks
from tuneforge.doctor.env_checks import (
    allocator_findings,
    filesystem_of,
    rocm_variables,
    shared_cache_findings,
    unresponsive_gpus,
)

MOUNTS = """/dev/vda / ext4 rw,relatime 0 0
home.cluster:/export/home /home nfs4 rw,relatime 0 0
lustre@o2ib:/scratch /scratch lustre rw 0 0
tmpfs /tmp tmpfs rw 0 0
"""


def test_allocator_variables_are_judged_against_this_build():
    cuda_2_10 = allocator_findings(
        {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}, "2.10.0", False
    )
    assert len(cuda_2_10) == 1 and "deprecated on torch 2.10.0" in cuda_2_10[0]
    assert allocator_findings({"PYTORCH_CUDA_ALLOC_CONF": "x"}, "2.5.1+cu124", False) == []
    hip_on_cuda = allocator_findings({"PYTORCH_HIP_ALLOC_CONF": "x"}, "2.5.1+cu124", False)
    assert "not a ROCm build: it does nothing here" in hip_on_cuda[0]
    assert allocator_findings({"PYTORCH_HIP_ALLOC_CONF": "x"}, "2.5.1+rocm6.2", True) == []
    both = allocator_findings(
        {"PYTORCH_ALLOC_CONF": "expandable_segments:True", "PYTORCH_HIP_ALLOC_CONF": "garbage"},
        "2.9.0+rocm6.4",
        True,
    )
    assert any("different values" in line and "keep one" in line for line in both)
    assert (
        allocator_findings({"PYTORCH_ALLOC_CONF": "expandable_segments:True"}, "2.9.1", False) == []
    )


def test_rocm_variables_are_collected():
    env = {
        "HSA_XNACK": "1",
        "HIP_VISIBLE_DEVICES": "0,1",
        "GPU_MAX_HW_QUEUES": "2",
        "AMD_SERIALIZE_KERNEL": "3",
        "MIOPEN_USER_DB_PATH": "/tmp/m",
        "PATH": "/bin",
    }
    assert set(rocm_variables(env)) == set(env) - {"PATH"}


def test_compile_caches_on_shared_file_systems_are_named():
    assert filesystem_of(Path("/home/ada/.triton/cache"), MOUNTS) == "nfs4"
    assert filesystem_of(Path("/scratch/ada"), MOUNTS) == "lustre"
    assert filesystem_of(Path("/tmp/ada"), MOUNTS) == "tmpfs"
    found = shared_cache_findings(
        {"HOME": "/home/ada", "TRITON_CACHE_DIR": "/scratch/ada/triton"}, MOUNTS
    )
    assert any("TRITON_CACHE_DIR=/scratch/ada/triton is on a shared lustre" in f for f in found)
    local = {"TRITON_CACHE_DIR": "/tmp/ada/triton", "MIOPEN_USER_DB_PATH": "/tmp/ada/miopen"}
    assert shared_cache_findings(local, MOUNTS) == []


def test_a_gpu_that_hangs_is_named_and_does_not_hang_doctor(monkeypatch):
    hang = "import time\nprint(0, flush=True)\nprint(1, flush=True)\ntime.sleep(60)\n"
    real_run = env_checks.subprocess.run

    def run(args, **kwargs):
        return real_run([sys.executable, "-c", hang], **kwargs)

    monkeypatch.setattr(env_checks.subprocess, "run", run)
    found = unresponsive_gpus(2, timeout_s=3)
    assert len(found) == 1 and found[0].startswith("GPU 1 did not finish a tiny operation")
    assert unresponsive_gpus(0) == []


def test_which_gpus_have_fp8_and_fp4_tensor_cores():
    from tuneforge.hardware.gpus import low_precision_cores

    assert low_precision_cores((8, 0)) == {"fp8": False, "fp4": False}  # A100
    assert low_precision_cores((8, 9)) == {"fp8": True, "fp4": False}  # L40S
    assert low_precision_cores((9, 0)) == {"fp8": True, "fp4": False}  # H100, H200
    assert low_precision_cores((10, 0)) == {"fp8": True, "fp4": True}  # B200
    assert low_precision_cores((9, 0), "gfx90a:sramecc+:xnack-") == {"fp8": False, "fp4": False}
    assert low_precision_cores((9, 4), "gfx942:sramecc+:xnack-") == {"fp8": True, "fp4": False}
    assert low_precision_cores((9, 5), "gfx950") == {"fp8": True, "fp4": True}


def test_the_optional_extras_installed_are_listed_from_the_packages_metadata(monkeypatch):
    import importlib.metadata

    from tuneforge.doctor.extras import describe_extras, optional_extras

    requires = ['torch>=2.11', 'gguf>=0.10; extra == "gguf"', 'bitsandbytes>=0.48; extra == "qlora"',
                'pytest>=8; extra == "dev"']  # fmt: skip
    installed = {"gguf": "0.19.0"}

    def version(name):
        if name not in installed:
            raise importlib.metadata.PackageNotFoundError(name)
        return installed[name]

    monkeypatch.setattr(importlib.metadata, "requires", lambda name: requires)
    monkeypatch.setattr(importlib.metadata, "version", version)
    extras = optional_extras()
    assert extras == {"gguf": {"gguf": "0.19.0"}, "qlora": {"bitsandbytes": None}}
    assert describe_extras(extras) == (
        "gguf (gguf 0.19.0); not installed: qlora (pip install 'tuneforge[NAME]')"
    )


def test_doctor_env_names_the_platform_without_a_blank_version(monkeypatch):
    """A CPU build has no platform version: `(cpu)`, not `(cpu )`."""
    from typer.testing import CliRunner

    import tuneforge.doctor.env as env
    from tuneforge.cli.main import app

    report = env.EnvReport(torch="2.13.0+cpu", platform="cpu", platform_version=None)
    monkeypatch.setattr(env, "inspect_environment", lambda: report)
    monkeypatch.setattr("tuneforge.doctor.extras.describe_extras", lambda *_: [])
    result = CliRunner().invoke(app, ["doctor", "env"])
    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[0] == "torch 2.13.0+cpu (cpu)"
    report.platform, report.platform_version = "cuda", "12.8"
    assert (
        CliRunner().invoke(app, ["doctor", "env"]).output.startswith("torch 2.13.0+cpu (cuda 12.8)")
    )
