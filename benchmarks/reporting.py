"""What every benchmark reports: how a cost grows with size, and the results file."""

import json
import os

import numpy as np


def growth_exponent(sizes, seconds):
    """The exponent of a least-squares power-law fit of ``seconds`` on ``sizes`` (1.0 is linear)."""
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def write_results(result, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        json.dump(result, out, indent=2)
    print(f"results written to {path}")
