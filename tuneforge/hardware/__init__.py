"""Facts about the machine: GPU tables and units, and the GPU's clocks through NVML."""
