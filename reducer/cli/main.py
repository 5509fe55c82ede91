"""`reduction-server` entry point: dispatches to one module per subcommand.

Each subcommand module in reducer/cli/ exposes
    register(subparsers) -> None   # adds its parser and sets `func=run`
    run(args) -> int               # the exit status
and is listed in SUBCOMMANDS. Modules are imported lazily so that one
subcommand's optional dependencies never slow down or break another.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import NoReturn

from reducer import __version__
from reducer.config import setup_logging

# (name, module) in the order `--help` shows them.
SUBCOMMANDS = [
    ("serve", "reducer.cli.serve"),
    ("status", "reducer.cli.status"),
    ("drain", "reducer.cli.drain"),
    ("launch", "reducer.cli.launch"),
    ("bench", "reducer.cli.bench"),
    ("plan", "reducer.cli.plan"),
    ("simulate", "reducer.cli.simulate"),
    ("vertex-job", "reducer.cli.vertex_job"),
    ("job-token", "reducer.cli.job_token"),
    ("nccl-plugin", "reducer.cli.nccl_plugin"),
]


class OneLineErrorParser(argparse.ArgumentParser):
    """An ArgumentParser whose errors are one line on stderr and exit status 2.

    argparse prints the whole usage before a bad value (`serve --port abc`: 14 lines) but a single
    line for errors raised later (`--port 99999`); every command answers bad input the second way,
    naming the flag, with a pointer to its --help.
    """

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineErrorParser(
        prog="reduction-server",
        description="Reduction server: a faster all-reduce for data-parallel training.",
    )
    parser.add_argument("--log-level", default=None, help="logging level (default: $RS_LOG_LEVEL or INFO)")
    parser.add_argument(
        "--version", action="version", version=f"%(prog)s {__version__}", help="print the version and exit"
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineErrorParser)
    sub.required = True
    for _name, module in SUBCOMMANDS:
        try:
            mod = importlib.import_module(module)
        except ModuleNotFoundError as exc:  # a subcommand not built into this install
            if exc.name == module:
                continue
            raise
        mod.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args, extra = parser.parse_known_args(argv)
    if extra:  # reported by the subcommand's parser (`serve --bogus` is serve's error, not the top level's)
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        sub.choices[args.command].error(f"unrecognized arguments: {' '.join(extra)}")
    setup_logging(args.log_level)
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
