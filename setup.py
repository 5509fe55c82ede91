"""Build the C++ core (reducer._core) and the NCCL plugin (reducer/lib/libnccl-net-reduction-server.so).

Everything in csrc/ except csrc/nccl_plugin/ is compiled into one extension module for baseline
x86-64 (no host-specific -march flag): the SIMD kernels are compiled per target with function
attributes and picked at run time (see csrc/kernels/dispatch.cc).

The NCCL plugin is a plain shared library (a C ABI, no Python, no CUDA, no NCCL) that NCCL
dlopens; it is built from csrc/nccl_plugin/ plus the core's client, sockets, wire format and
kernels, exports only NCCL's plugin symbols, and ships inside the package (docs/nccl-plugin.md).
"""
import os
from glob import glob

from pybind11.setup_helpers import ParallelCompile, Pybind11Extension, build_ext
from setuptools import setup

# Compile the sources in parallel (RS_BUILD_JOBS, default: every CPU).
ParallelCompile("RS_BUILD_JOBS").install()

PLUGIN_DIR = os.path.join("csrc", "nccl_plugin")
PLUGIN_NAME = "libnccl-net-reduction-server.so"
# The parts of the core the plugin links (the reducer, ring and Python bindings stay out).
PLUGIN_CORE_DIRS = ["common", "cluster", "client", "net", "protocol", "kernels"]

CXX_FLAGS = ["-O3", "-fvisibility=hidden", "-Wall", "-Wextra"]


def crypto_link() -> tuple:
    """How the extension and the plugin link OpenSSL's libcrypto: (libraries, extra link arguments).

    Default: the shared libcrypto.so.3 (the one Python's ssl module loads). RS_STATIC_CRYPTO=1
    (scripts/build-wheel.sh) links libcrypto.a instead (RS_LIBCRYPTO_A names it; Debian: libssl-dev)
    with its symbols hidden, so a wheel needs no libcrypto.so.3 where it is installed and the NCCL
    plugin stays one self-contained file when `reduction-server nccl-plugin --install` copies it.
    """
    if os.environ.get("RS_STATIC_CRYPTO", "0") in ("", "0"):
        return ["crypto"], []
    candidates = [os.environ.get("RS_LIBCRYPTO_A", "")] + sorted(
        glob("/usr/lib/*/libcrypto.a") + glob("/usr/lib64/libcrypto.a") + glob("/usr/local/lib*/libcrypto.a"))
    archive = next((c for c in candidates if c and os.path.isfile(c)), None)
    if archive is None:
        raise SystemExit("RS_STATIC_CRYPTO=1: no libcrypto.a found (install libssl-dev / openssl-devel "
                         "or set RS_LIBCRYPTO_A=/path/to/libcrypto.a)")
    return [], [archive, "-Wl,--exclude-libs,ALL", "-ldl"]


CRYPTO_LIBS, CRYPTO_LINK_ARGS = crypto_link()

# csrc/nccl_plugin is its own library (below); csrc/fuzz holds the libFuzzer targets (scripts/fuzz.sh).
sources = sorted(s for s in glob("csrc/**/*.cc", recursive=True)
                 if not s.startswith((PLUGIN_DIR + os.sep, os.path.join("csrc", "fuzz") + os.sep)))

ext = Pybind11Extension(
    "reducer._core",
    sources,
    # Headers too: build_ext rebuilds only when a listed file is newer than the module, so without
    # them an edit to a header (a constant in protocol/plan.h, say) would leave a stale module.
    depends=sorted(glob("csrc/**/*.h", recursive=True) + glob("csrc/**/*.inc", recursive=True)),
    include_dirs=["csrc"],
    cxx_std=17,
    extra_compile_args=CXX_FLAGS,
    extra_link_args=["-pthread"] + CRYPTO_LINK_ARGS,
    # OpenSSL's libcrypto (see crypto_link): AES-GCM for frame integrity (csrc/net/frame_auth.cc).
    # Building needs its headers (Debian: libssl-dev).
    libraries=CRYPTO_LIBS,
)


class BuildExtWithPlugin(build_ext):
    """build_ext that also links the NCCL plugin library next to the extension's package."""

    def run(self) -> None:
        super().run()
        self.build_nccl_plugin()

    def build_nccl_plugin(self) -> None:
        plugin_sources = sorted(glob(os.path.join(PLUGIN_DIR, "*.cc")))
        for d in PLUGIN_CORE_DIRS:
            plugin_sources += sorted(glob(os.path.join("csrc", d, "*.cc")))
        root = "." if self.inplace else self.build_lib
        out_dir = os.path.join(root, "reducer", "lib")
        os.makedirs(out_dir, exist_ok=True)
        objects = self.compiler.compile(
            plugin_sources,
            output_dir=os.path.join(self.build_temp, "nccl_plugin"),
            include_dirs=["csrc"],
            extra_postargs=CXX_FLAGS + ["-std=c++17", "-fPIC"],
        )
        self.compiler.link_shared_object(
            objects,
            os.path.join(out_dir, PLUGIN_NAME),
            # frame integrity, as in the extension; dl: dladdr/dlsym find the loading NCCL's version
            # (libc has them from glibc 2.34). No CUDA, no NCCL.
            libraries=CRYPTO_LIBS + ["dl"],
            extra_postargs=CRYPTO_LINK_ARGS + ["-pthread", "-Wl,--no-undefined",
                                               "-Wl,--version-script=" + os.path.join(PLUGIN_DIR, "exports.map")],
            target_lang="c++",
        )


setup(ext_modules=[ext], cmdclass={"build_ext": BuildExtWithPlugin})
