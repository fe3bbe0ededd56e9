"""Training: the loop, losses, optimizer and schedule, evaluation, checkpoints and metrics."""
