"""The `numbakv` command line."""

import argparse


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="numbakv", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser("demo", help="run a mixed workload and print the pool's occupancy")
    demo.add_argument("--seed", type=int, default=0, help="seed of the random K/V (default 0)")
    demo.add_argument("--columns", type=int, default=64, help="cells per line of the map")
    args = parser.parse_args(argv)
    if args.command == "demo":
        from numbakv import demo as demo_module

        work = demo_module.run(seed=args.seed, columns=args.columns)
        return 0 if work.max_error < 1e-4 else 1
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
