"""Diagnosis: out-of-memory messages, training logs and the environment."""
