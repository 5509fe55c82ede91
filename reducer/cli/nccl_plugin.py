"""`reduction-server nccl-plugin`: where the NCCL plugin library is and how to turn it on.

The library (``reducer/lib/libnccl-net-reduction-server.so``, built with the package) is an NCCL
network plugin: with it, NCCL's all-reduce between nodes goes through the reducer pool with no
change to the training code (docs/nccl-plugin.md).

NCCL finds a plugin by file name on the dynamic loader's path. The one setting every NCCL from
2.19 to 2.30 loads is ``NCCL_NET_PLUGIN=reduction-server``: 2.19-2.20 try only
``libnccl-net-<value>.so`` (a full path loads nothing there), later releases try the value itself
and then that name. So the library's directory must be on the loader's path
(``LD_LIBRARY_PATH``, or ``/etc/ld.so.conf.d`` + ``ldconfig``), which the printed exports do for
a shell. ``--install DIR`` puts the library in DIR under that name, plus ``libnccl-net.so`` (the
name NCCL loads when ``NCCL_NET_PLUGIN`` is unset) as a link to it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path

LIBRARY_NAME = "libnccl-net-reduction-server.so"
PLUGIN_NAME = "reduction-server"  # NCCL_NET_PLUGIN: NCCL dlopens libnccl-net-<name>.so
DEFAULT_NAME = "libnccl-net.so"
_OURS_MARKER = b"NET/reduction-server"  # in every build of this library (its log prefix)


def plugin_path() -> Path:
    """The plugin library shipped in this package; FileNotFoundError if it was not built."""
    path = Path(__file__).resolve().parent.parent / "lib" / LIBRARY_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"the NCCL plugin library {path} is missing: install the package with `pip install .` "
            f"(or run `python setup.py build_ext --inplace` in a source checkout)"
        )
    return path


def plugin_environment() -> dict[str, str]:
    """NCCL's settings that load the plugin (from a directory on the loader's path) and enable CollNet."""
    return {"NCCL_NET_PLUGIN": PLUGIN_NAME, "NCCL_COLLNET_ENABLE": "1"}


def nccl_conf() -> str:
    """/etc/nccl.conf lines with the same settings (NCCL reads that file at start-up; it cannot
    set the loader's path, which must come from LD_LIBRARY_PATH or ldconfig)."""
    return "".join(f"{k}={v}\n" for k, v in plugin_environment().items())


def shell_exports(directory: Path) -> list[str]:
    """`export` lines for a POSIX shell: the loader's path first, then NCCL's settings."""
    lines = [f'export LD_LIBRARY_PATH="{directory}${{LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}}"']
    lines += [f"export {k}={v}" for k, v in plugin_environment().items()]
    return lines


def _is_ours(path: Path) -> bool:
    if path.is_symlink():
        return os.readlink(path) == LIBRARY_NAME
    try:
        return _OURS_MARKER in path.read_bytes()
    except OSError:
        return False


def install(directory: Path) -> list[str]:
    """Copy the library to directory/libnccl-net-reduction-server.so and link libnccl-net.so to
    it (unless that name holds another plugin, which stays). Returns notes for the user."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / LIBRARY_NAME
    tmp = directory / (LIBRARY_NAME + ".tmp")
    shutil.copy2(plugin_path(), tmp)
    tmp.replace(target)
    notes: list[str] = []
    default = directory / DEFAULT_NAME
    if (default.exists() or default.is_symlink()) and not _is_ours(default):
        notes.append(f"{default} is another plugin: left as it is (NCCL_NET_PLUGIN={PLUGIN_NAME} selects this one)")
        return notes
    link_tmp = directory / (DEFAULT_NAME + ".tmp")
    if link_tmp.is_symlink() or link_tmp.exists():
        link_tmp.unlink()
    link_tmp.symlink_to(LIBRARY_NAME)
    link_tmp.replace(default)
    return notes


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser(
        "nccl-plugin",
        help="print the NCCL plugin library's path and the environment that enables it",
        description="Prints where the NCCL network plugin shipped with this package is and the "
        "environment (or /etc/nccl.conf lines) that makes NCCL 2.19-2.30 load it and route "
        "its inter-node all-reduce through the reducers. The reducers are found like "
        "reducer.init() finds them: CLUSTER_SPEC, TF_CONFIG or RS_REDUCERS.",
    )
    p.add_argument(
        "--install",
        metavar="DIR",
        type=Path,
        default=None,
        help=f"copy the library to DIR/{LIBRARY_NAME} and link DIR/{DEFAULT_NAME} to it; DIR must "
        f"then be on the loader's path (LD_LIBRARY_PATH, or /etc/ld.so.conf.d + ldconfig)",
    )
    p.add_argument("--conf", action="store_true", help="print nccl.conf lines instead of shell exports")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    notes: list[str] = []
    try:
        if args.install is not None:
            notes = install(args.install)
            directory = args.install.resolve()
        else:
            directory = plugin_path().parent
    except OSError as exc:
        where = f"cannot install into {args.install}" if args.install is not None else "cannot find the library"
        print(f"reduction-server nccl-plugin: error: {where}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    for note in notes:
        print(f"reduction-server nccl-plugin: {note}", file=sys.stderr)
    if args.conf:
        sys.stdout.write(nccl_conf())
        print(
            f"reduction-server nccl-plugin: NCCL loads {LIBRARY_NAME} by name: {directory} must be on the "
            f"loader's path (LD_LIBRARY_PATH, or /etc/ld.so.conf.d + ldconfig)",
            file=sys.stderr,
        )
        return 0
    print(f"# NCCL plugin library: {directory / LIBRARY_NAME}")
    for line in shell_exports(directory):
        print(line)
    print("# reducers: CLUSTER_SPEC (Vertex AI), TF_CONFIG, or RS_REDUCERS=host:port,...")
    return 0
