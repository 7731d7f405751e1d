"""How a cost grows with size: the exponent of a least-squares power-law fit (1.0 is linear)."""

import numpy as np


def growth_exponent(sizes, seconds):
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])
