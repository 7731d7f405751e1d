"""Backends: the reference interpreter (the oracle) and, later, the CPU and GPU executors."""
