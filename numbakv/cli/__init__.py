"""The `numbakv` command line: `numbakv demo`, `numbakv viz` and `numbakv replay`.

Exit codes: 0 done; 2 a usage error (a bad option value, a missing input, an output in a
folder that does not exist or with an extension matplotlib cannot write, a factory that
cannot be imported), found before the work starts (for `--step` and `--window`, once the
trace is read; for `replay`, a damaged or hostile op log, a factory that raises or makes
no cache); 1 a failure (a damaged trace, the device disagreeing with the reference, an
output that could not be written, a replayed cache diverging from the reference or
crashing: then the shrunk op script is printed on stdout). Every error is one line on
stderr naming the bad argument or file.

    args    what the commands share: argparse types over `numbakv.core.calls`, one-line errors
    demo    `numbakv demo`: the serving workload on the device, checked against the reference
    viz     `numbakv viz`: the pictures of a trace
    replay  `numbakv replay`: an op log or trace replayed into a cache beside the reference
    process what the executable sets up in its own process (`command`) and `main` does not
"""

import numbakv
from numbakv.cli import demo, replay, viz
from numbakv.cli.args import Parser
from numbakv.cli.process import set_up


def main(argv: list[str] | None = None) -> int:
    """Runs `numbakv ARGS` (default: sys.argv[1:]); returns the exit status, or raises
    SystemExit(2) on a usage error (SystemExit(0) for --help and --version)."""
    parser = Parser(prog="numbakv", description=__doc__.splitlines()[0])
    parser.add_argument("--version", action="version", version=f"numbakv {numbakv.__version__}")
    commands = parser.add_subparsers(dest="command", required=True)
    for command in (demo, viz, replay):
        command.add_command(commands)
    args = parser.parse_args(argv)
    return args.run(args, args.parser)


def command() -> int:
    """The `numbakv` executable (and `python -m numbakv`): `main()` in a process set up as
    a command owns it and a program calling `main` may not want (`process.set_up`: its
    allocator keeps the memory it frees, numpy's arrays on small pages)."""
    set_up()
    return main()
