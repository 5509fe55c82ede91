# syntax=docker/dockerfile:1
# A GPU worker image: PyTorch + this package (`pip install .[torch]`) + the examples, and the
# NCCL plugin installed as libnccl-net.so and enabled in /etc/nccl.conf.
# Build from the repository root with
#   scripts/build-images.sh            (docker or podman; stand-in bases when no registry answers)
# or by hand:
#   docker build -f docker/worker.Dockerfile -t reduction-server/worker:latest .
# Pick another PyTorch base with --build-arg BASE=pytorch/pytorch:<tag>; the build and
# runtime stages must use the same base (same Python).
ARG BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

# -- build: compile the C++ core into a wheel (the runtime base has no compiler) --------------
FROM ${BASE} AS build
# Untagged once built (podman keeps it as a `<none>` image): scripts/build-images.sh removes it by this label.
LABEL io.reduction-server.build-stage=true
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ libssl-dev ccache \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# pip: scripts/build-images.sh passes the host's pip settings (index URLs, CA bundle) as the
# build secrets pip_conf (a pip.conf) and pip_cert; a plain `docker build` goes without them.
# The build requirements ([build-system] requires; tomllib: Python >= 3.11) in a layer of their
# own, at fixed paths: with pip's build isolation every build compiled against a new random
# /tmp/pip-build-env-* include path, and ccache could never hit.
COPY pyproject.toml ./
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_cert \
    set -e; if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    python -c "import tomllib; print(*tomllib.load(open('pyproject.toml', 'rb'))['build-system']['requires'], sep='\n')" \
        > /tmp/build-requires.txt; \
    pip install --no-cache-dir -r /tmp/build-requires.txt
# Only what the wheel is built from: an edit to tests/ or docs/ does not recompile the core.
COPY setup.py README.md ./
COPY csrc/ csrc/
COPY reducer/ reducer/
COPY benchmarks/ benchmarks/
# ccache (a build cache mount) makes rebuilds after small edits, and the other image's compile
# of the same sources on the same base, mostly cache hits. `.so` files from the host never get
# here (.dockerignore), so the extension is compiled for this image's glibc and Python.
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_cert --mount=type=cache,target=/root/.cache/ccache \
    set -e; if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    ccache --zero-stats >/dev/null; CC="ccache gcc" CXX="ccache g++" pip wheel --no-build-isolation --no-cache-dir --no-deps --wheel-dir /wheels .; \
    ccache --show-stats | grep -Ei "hits|misses" || true

# -- runtime ---------------------------------------------------------------------------------
FROM ${BASE}
ENV PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The core links OpenSSL's libcrypto (frame integrity); `openssl` pulls in this base's libssl.
RUN apt-get update \
    && apt-get install -y --no-install-recommends openssl \
    && rm -rf /var/lib/apt/lists/*
# The package's extras: `torch` is already satisfied by a PyTorch base's torch (pip keeps it).
# scripts/build-images.sh passes EXTRAS= (none) on its stand-in base, which has no PyTorch:
# installing the extra there would download a CUDA build of torch.
ARG EXTRAS=torch
COPY --from=build /wheels /wheels
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_cert --mount=type=cache,target=/root/.cache/pip \
    set -e; if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    whl="$(ls /wheels/*.whl)"; pip install "${whl}${EXTRAS:+[${EXTRAS}]}"; rm -rf /wheels
ENV PIP_NO_CACHE_DIR=1
# The NCCL plugin (docs/nccl-plugin.md): NCCL's inter-node all-reduce goes to the reducers
# (workerPoolSpecs[2]) with no change to the training code. It is installed under NCCL's default
# plugin name and enabled in /etc/nccl.conf; without reducers in CLUSTER_SPEC / TF_CONFIG /
# RS_REDUCERS it offers no CollNet device and NCCL uses only its point-to-point TCP net.
RUN set -e; \
    reduction-server nccl-plugin --install /usr/local/lib/reduction-server --conf > /etc/nccl.conf; \
    echo /usr/local/lib/reduction-server > /etc/ld.so.conf.d/reduction-server.conf; \
    ldconfig; \
    cat /etc/nccl.conf
WORKDIR /opt/reduction-server
COPY examples/ examples/
EXPOSE 2222
# No ENTRYPOINT: Vertex AI containerSpec.args / Kubernetes args give the whole command.
CMD ["python", "examples/allreduce_numpy.py"]
