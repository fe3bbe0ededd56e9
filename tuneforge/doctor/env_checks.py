"""Checks of `doctor env` that read only variables, mount tables and version strings (so they are
tested without a GPU): the allocator variables against this torch build, the ROCm variables that
change a run, compile caches on shared file systems, and a GPU that does not answer."""

import os
import re
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

ALLOCATOR_VARIABLES = ("PYTORCH_ALLOC_CONF", "PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF")
ROCM_VARIABLES = re.compile(
    r"^(HSA_\w+|HIP_VISIBLE_DEVICES|ROCR_VISIBLE_DEVICES|GPU_MAX_HW_QUEUES|AMD_SERIALIZE_\w+|"
    r"MIOPEN_USER_DB_PATH|MIOPEN_CUSTOM_CACHE_DIR|TRITON_CACHE_DIR|AMD_LOG_LEVEL)$"
)
SHARED_FILESYSTEMS = {
    "nfs",
    "nfs4",
    "lustre",
    "gpfs",
    "beegfs",
    "cifs",
    "smb3",
    "cephfs",
    "fuse.sshfs",
}
CACHES = {
    "TRITON_CACHE_DIR": "~/.triton/cache",
    "MIOPEN_USER_DB_PATH": "~/.config/miopen",
}
"""Compile caches and where they go when the variable is unset."""
GPU_PROBE_TIMEOUT_S = 60.0


def _version(torch_version: str) -> tuple[int, int]:
    major, minor = (int(part) for part in re.findall(r"\d+", torch_version)[:2])
    return major, minor


def allocator_findings(env: Mapping[str, str], torch_version: str, rocm: bool) -> list[str]:
    """What is wrong with the allocator variables set, for this torch build."""
    found = []
    set_now = {name: env[name] for name in ALLOCATOR_VARIABLES if name in env}
    unified = _version(torch_version) >= (2, 9)
    for name in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_HIP_ALLOC_CONF"):
        if name not in set_now:
            continue
        if name == "PYTORCH_HIP_ALLOC_CONF" and not rocm:
            found.append(
                f"{name} is set, but this torch is not a ROCm build: it does nothing here "
                "(set PYTORCH_ALLOC_CONF, or PYTORCH_CUDA_ALLOC_CONF before torch 2.9)"
            )
        elif name == "PYTORCH_CUDA_ALLOC_CONF" and rocm and not unified:
            found.append(f"{name} is set, but this ROCm torch reads PYTORCH_HIP_ALLOC_CONF")
        elif unified:
            found.append(
                f"{name} is deprecated on torch {torch_version}: use PYTORCH_ALLOC_CONF with "
                "the same value"
            )
    if len(set(set_now.values())) > 1:
        listed = ", ".join(f"{name}={value}" for name, value in set_now.items())
        found.append(
            f"{len(set_now)} allocator variables are set with different values ({listed}): "
            "only one is read; keep one"
        )
    return found


def rocm_variables(env: Mapping[str, str]) -> dict[str, str]:
    return {name: value for name, value in env.items() if ROCM_VARIABLES.match(name)}


def filesystem_of(path: Path, mounts: str) -> str | None:
    """The file-system type of the mount that holds `path`, from a /proc/mounts text."""
    best, kind = "", None
    target = str(path)
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = fields[1].replace("\\040", " ")
        inside = target == point or target.startswith(point.rstrip("/") + "/")
        if inside and len(point) > len(best):
            best, kind = point, fields[2]
    return kind


def shared_cache_findings(env: Mapping[str, str], mounts: str) -> list[str]:
    """Compile caches on a file system every node shares: their locks and many small files
    make each rank wait (and concurrent writers can corrupt them)."""
    found = []
    for variable, default in CACHES.items():
        path = Path(os.path.expanduser(env.get(variable) or default))
        kind = filesystem_of(path, mounts)
        if kind in SHARED_FILESYSTEMS:
            where = f"{variable}={path}" if variable in env else f"{path} ({variable} unset)"
            found.append(
                f"{where} is on a shared {kind} file system: point {variable} at node-local "
                "storage (e.g. /tmp/$USER/...) so that ranks do not wait on each other's cache"
            )
    return found


def unresponsive_gpus(count: int, timeout_s: float = GPU_PROBE_TIMEOUT_S) -> list[str]:
    """Run a tiny operation on each GPU in a child process under a timeout: a GPU that hangs
    would hang this process too."""
    if count == 0:
        return []
    script = (
        "import torch\n"
        f"for index in range({count}):\n"
        "    print(index, flush=True)\n"
        "    x = torch.ones(8, device=f'cuda:{index}')\n"
        "    assert float((x * 2).sum()) == 16.0\n"
        "print('done', flush=True)\n"
    )
    try:
        result = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout_s
        )
    except subprocess.TimeoutExpired as expired:
        out = expired.stdout or ""
        started = out.decode() if isinstance(out, bytes) else out
        last = started.split()[-1] if started.split() else "0"
        return [
            f"GPU {last} did not finish a tiny operation within {timeout_s:.0f} s: the GPU or its "
            "driver hangs; leave the node out (sbatch --exclude=NODE) and tell the admins"
        ]
    if result.returncode != 0 or "done" not in result.stdout:
        lines = (result.stderr or result.stdout).strip().splitlines()
        return [f"a tiny operation on the GPUs failed: {lines[-1] if lines else result.returncode}"]
    return []
