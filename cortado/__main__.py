"""``python -m cortado``: the command line (``demo`` for now; ``explain`` and ``bench`` later)."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cortado", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="build a small MLP as expressions, print it, evaluate it")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random data (default 0)")
    demo.add_argument("--dot", metavar="PATH", help="also write the graph as Graphviz DOT to PATH")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from .demo import run

        run(seed=args.seed, dot_path=args.dot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
