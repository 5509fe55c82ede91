"""`reduction-server nccl-plugin`: where the NCCL plugin library is and how to turn it on.

The library (``reducer/lib/libnccl-net-reduction-server.so``, built with the package) is an NCCL
network plugin: with it, NCCL's all-reduce between nodes goes through the reducer pool with no
change to the training code (docs/nccl-plugin.md). This command prints its path and the
environment that enables it; ``--install DIR`` copies it to ``DIR/libnccl-net.so``, the name
NCCL loads by default (so ``NCCL_NET_PLUGIN`` is not even needed when DIR is on the loader path).
"""
from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path
from typing import Dict

LIBRARY_NAME = "libnccl-net-reduction-server.so"
DEFAULT_NAME = "libnccl-net.so"


def plugin_path() -> Path:
    """The plugin library shipped in this package; FileNotFoundError if it was not built."""
    path = Path(__file__).resolve().parent.parent / "lib" / LIBRARY_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"the NCCL plugin library {path} is missing: install the package with `pip install .` "
            f"(or run `python setup.py build_ext --inplace` in a source checkout)"
        )
    return path


def plugin_environment(library: Path) -> Dict[str, str]:
    """The variables that make NCCL load the plugin and use CollNet (the reducers)."""
    return {
        "NCCL_NET_PLUGIN": str(library),
        "NCCL_COLLNET_ENABLE": "1",
    }


def nccl_conf(library: Path) -> str:
    """/etc/nccl.conf lines with the same settings (NCCL reads that file at start-up)."""
    return "".join(f"{k}={v}\n" for k, v in plugin_environment(library).items())


def install(directory: Path) -> Path:
    """Copy the library to directory/libnccl-net.so; returns the new path."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / DEFAULT_NAME
    tmp = directory / (DEFAULT_NAME + ".tmp")
    shutil.copy2(plugin_path(), tmp)
    tmp.replace(target)
    return target


def register(subparsers: "argparse._SubParsersAction[argparse.ArgumentParser]") -> None:
    p = subparsers.add_parser(
        "nccl-plugin",
        help="print the NCCL plugin library's path and the environment that enables it",
        description="Prints the path of the NCCL network plugin shipped with this package and the "
                    "environment (or /etc/nccl.conf lines) that makes NCCL route its inter-node "
                    "all-reduce through the reducers. The reducers are found like reducer.init() "
                    "finds them: CLUSTER_SPEC, TF_CONFIG or RS_REDUCERS.",
    )
    p.add_argument("--install", metavar="DIR", type=Path, default=None,
                   help=f"copy the library to DIR/{DEFAULT_NAME} (the name NCCL loads by default)")
    p.add_argument("--conf", action="store_true", help="print nccl.conf lines instead of shell exports")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        library = install(args.install) if args.install is not None else plugin_path()
    except (FileNotFoundError, OSError) as exc:
        print(f"reduction-server nccl-plugin: error: {exc}", file=sys.stderr)
        return 1
    if args.conf:
        sys.stdout.write(nccl_conf(library))
        return 0
    print(f"# NCCL plugin library: {library}")
    for key, value in plugin_environment(library).items():
        print(f"export {key}={value}")
    print("# reducers: CLUSTER_SPEC (Vertex AI), TF_CONFIG, or RS_REDUCERS=host:port,...")
    print("# optional: NCCL_ALGO=allreduce:collnetchain forces CollNet when NCCL's tuner prefers a ring")
    return 0

