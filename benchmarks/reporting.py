"""What every benchmark shares: its command line, its table, how a cost grows, its results file."""

import argparse
import json
import os
import re

import numpy as np


def growth_exponent(sizes, seconds):
    """The exponent of a least-squares power-law fit of ``seconds`` on ``sizes`` (1.0 is linear)."""
    return float(np.polyfit(np.log(sizes), np.log(seconds), 1)[0])


def write_results(result, path):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as out:
        json.dump(result, out, indent=2)
    print(f"results written to {path}")


def command_line(doc, results_name, repeats):
    """The arguments every benchmark takes: ``--repeats`` and ``--out`` (``results/<results_name>``)."""
    parser = argparse.ArgumentParser(description=doc.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=repeats)
    parser.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "results", results_name))
    return parser.parse_args()


def measured_rows(sizes, measure, columns):
    """``measure(size)`` for each size, each row printed as it is measured.

    ``columns`` are ``(heading, key, format)`` with a width first in the format (``"9.3f"``).
    """
    print(" ".join(f"{heading:>{_width(spec)}}" for heading, _, spec in columns))
    rows = []
    for size in sizes:
        row = measure(size)
        rows.append(row)
        print(" ".join(format(row[key], ">" + spec) for _, key, spec in columns))
    return rows


def _width(spec):
    return int(re.match(r"\d+", spec).group())
