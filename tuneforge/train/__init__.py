"""The training recipe: the loop (schedule, pending step, stop check), the step, the objective
seam, the loss, optimizer and schedule, evaluation, checkpoints and metrics."""
