"""SLURM job chains that resume exactly: sbatch scripts, submission and status."""
