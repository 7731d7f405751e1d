"""A description of the machine a benchmark ran on, stored with its results."""

import os
import platform

import numpy as np


def describe():
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "numpy": np.__version__,
    }
