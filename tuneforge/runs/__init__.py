"""The run directory: its file names, the metrics reader, overwrite and resume places, what a
finished run leaves, the pace of a run, its projection, time budget and plots."""
