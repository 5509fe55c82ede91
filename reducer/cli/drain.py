"""`reduction-server drain HOST:PORT [...]`: ask reducers to drain over their control plane.

Each reducer stops accepting connections, lets its rounds in flight finish (up to --timeout, else
its own --drain-timeout), closes its data plane and answers NOT_SERVING from then on
(docs/operations.md, "Drain"). With an auth token (--auth-token-file, RS_AUTH_TOKEN,
RS_AUTH_TOKEN_FILE) the request is signed with it; a reducer that has a token refuses an
unsigned Drain, and one without a token refuses every Drain unless it was started with
--allow-unauthenticated-drain.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from reducer import config
from reducer.cli.status import control_addresses
from reducer.errors import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "drain",
        help="drain reducers (stop accepting, finish rounds in flight) over gRPC",
        description=__doc__.split("\n\n", 1)[1] if __doc__ else None,
    )
    p.add_argument(
        "addresses",
        nargs="*",
        metavar="HOST:PORT",
        help="control-plane addresses (default: the reducers of CLUSTER_SPEC / TF_CONFIG / RS_REDUCERS)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=0.0,
        help="seconds to let rounds in flight finish; 0 = each reducer's --drain-timeout (default)",
    )
    p.add_argument(
        "--no-wait",
        dest="wait",
        action="store_false",
        help="return once the drains have started (default: wait until the data planes stopped)",
    )
    p.add_argument(
        "--auth-token-file",
        default=None,
        help="file holding the shared secret (default: $RS_AUTH_TOKEN, $RS_AUTH_TOKEN_FILE)",
    )
    p.set_defaults(func=run)


def run(args: Any) -> int:
    try:
        config.check_seconds(args.timeout, "--timeout", zero=True)
        addresses = control_addresses(args.addresses)
        token = config.resolve_auth_token(token_file=args.auth_token_file)
    except ConfigError as exc:
        print(f"reduction-server drain: error: {exc}", file=sys.stderr)
        return 2
    from reducer.control.client import ControlClient, ControlError

    status = 0
    for address in addresses:
        try:
            with ControlClient(address) as client:
                reply = client.drain(args.timeout, wait=args.wait, token=token)
        except ControlError as exc:
            print(f"{address}: {exc.code.name if exc.code else 'error'}: {exc.detail}", file=sys.stderr)
            status = 1
            continue
        note = " (a drain had already started)" if reply["already_draining"] else ""
        print(f"{address}: {reply['state']}{note}")
    return status
