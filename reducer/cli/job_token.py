"""`reduction-server job-token`: a worker credential valid for one job only.

The reducers hold the shared secret; a worker given only `rsjob1:<job>:<key>` can join the groups
of that job and no other's (docs/security.md). The secret comes from --auth-token-file,
RS_AUTH_TOKEN or RS_AUTH_TOKEN_FILE, never from the command line (it would show in `ps`).
"""

from __future__ import annotations

import argparse
import sys

from reducer import config
from reducer.errors import ConfigError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "job-token",
        help="print a worker credential that is valid for one job only",
        description="Derives the job's key from the reducers' shared secret and prints the credential "
        "rsjob1:<job>:<key> to give the workers of that job as RS_AUTH_TOKEN. Workers holding it "
        "cannot join another job's groups; the reducers need only the shared secret.",
    )
    p.add_argument("--job", required=True, help="the job id (the workers' RS_JOB_ID / CLOUD_ML_JOB_ID)")
    p.add_argument(
        "--auth-token-file",
        default=None,
        help="file with the shared secret (default: $RS_AUTH_TOKEN, else $RS_AUTH_TOKEN_FILE)",
    )
    p.set_defaults(func=run)


def _secret_source(token_file: str | None) -> str:
    """Where resolve_auth_token(None, token_file) took the secret from."""
    if token_file is not None:
        return f"--auth-token-file {token_file}"
    return "RS_AUTH_TOKEN" if config.env_text("auth_token") is not None else "RS_AUTH_TOKEN_FILE"


def run(args: argparse.Namespace) -> int:
    from reducer._native import core  # noqa: PLC0415 (the C++ core: the CLI starts without it)

    try:
        secret = config.resolve_auth_token(None, args.auth_token_file)
        if not secret:
            raise ConfigError("no shared secret: set RS_AUTH_TOKEN or RS_AUTH_TOKEN_FILE, or pass --auth-token-file")
        try:
            token = core.job_token(secret, args.job)
        except ConfigError as exc:  # a job credential given as the secret: say where it came from
            raise ConfigError(f"{_secret_source(args.auth_token_file)}: {exc}") from None
    except (ConfigError, ValueError) as exc:
        print(f"reduction-server job-token: error: {exc}", file=sys.stderr)
        return 2
    sys.stdout.write(token + "\n")
    return 0
