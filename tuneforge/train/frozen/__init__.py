"""Models held frozen beside the trained one, and the passes some make over the data before
training (a precomputed reference, a cached teacher)."""
