"""How many threads a run on the CPU computes with. Torch starts one per core; on a machine
already busy those threads wait for each other (a 2-core machine under load ran the demo seven
times slower with two threads than with one), so the cores other work keeps busy are left to it.
`OMP_NUM_THREADS` set by the user always wins."""

import os
from dataclasses import dataclass

CPU_PEAK_GFLOPS_PER_CORE = 50.0
"""fp32 FMAs of one x86 core with AVX2 (two 8-lane FMA units at ~3 GHz): a rough peak for
planning CPU runs, which run small models far below it anyway."""


@dataclass(frozen=True)
class CpuThreads:
    threads: int
    cores: int
    """CPUs this process may run on."""
    load: float
    """Processes running or waiting, averaged over the last minute."""
    reason: str

    def describe(self) -> str:
        return (
            f"{self.threads} CPU thread(s) ({self.reason}; {self.cores} core(s), load "
            f"{self.load:.1f}); set OMP_NUM_THREADS to choose"
        )


def choose_cpu_threads(processes: int = 1) -> CpuThreads:
    """Threads for each of `processes` processes computing on this machine's CPUs."""
    cores = cpu_cores()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    requested = os.environ.get("OMP_NUM_THREADS", "")
    if requested.isdigit() and int(requested) > 0:
        return CpuThreads(int(requested), cores, load, "OMP_NUM_THREADS")
    idle = max(1, cores - int(load))  # a core busy part of the time is still worth a thread
    threads = max(1, min(cores, idle) // processes)
    reason = "the idle cores" if idle < cores else "one per core"
    if processes > 1:
        reason += f", shared by {processes} processes"
    return CpuThreads(threads, cores, load, reason)


def cpu_cores() -> int:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def host_memory_gib() -> float:
    return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30


def cpu_peak_tflops(cores: int) -> float:
    return cores * CPU_PEAK_GFLOPS_PER_CORE / 1000
