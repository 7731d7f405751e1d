"""``python -m cortado``: the command line: ``demo`` trains a small model, its step compiled."""

import argparse
import sys


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cortado", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="train a small MLP by gradient descent, its step compiled")
    demo.add_argument("--seed", type=int, default=0, help="seed of the data and the initial weights (default 0)")
    demo.add_argument("--model", choices=["mlp", "cnn"], default="mlp",
                      help="mlp: the MLP on spirals (default); cnn: a small CNN on drawn images (examples/cnn.py)")
    demo.add_argument("--epochs", type=int, help="passes over the data (default 60 for the MLP, 8 for the CNN)")
    demo.add_argument("--dot", metavar="PATH", help="also write the graph of the loss and its gradients as DOT (mlp)")
    demo.add_argument("--plan", metavar="PATH",
                      help="where to draw the step's memory plan (mlp; default memory_plan.png; needs matplotlib)")
    args = parser.parse_args(argv)
    if args.command == "demo" and args.model == "cnn" and (args.dot or args.plan):
        parser.error("--dot and --plan draw the MLP's graph and plan; the CNN demo draws neither")
    if args.command == "demo" and args.model == "cnn":
        from .demo import run_cnn

        run_cnn(seed=args.seed, epochs=args.epochs or 8)
    elif args.command == "demo":
        from .demo import run

        run(seed=args.seed, epochs=args.epochs or 60, dot_path=args.dot, plan_path=args.plan or "memory_plan.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
