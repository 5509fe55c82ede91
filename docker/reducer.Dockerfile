# syntax=docker/dockerfile:1
# The reducer node image: a CPU-only `reduction-server serve` (Vertex AI pool 2, or the
# StatefulSet in examples/kubernetes/). Build from the repository root with
#   scripts/build-images.sh            (docker or podman; stand-in bases when no registry answers)
# or by hand:
#   docker build -f docker/reducer.Dockerfile -t reduction-server/reducer:latest .
# The reducer finds its port and peers in CLUSTER_SPEC / TF_CONFIG / RS_* (docs/configuration.md).
ARG PYTHON_VERSION=3.11

# -- build: compile the C++ core into a wheel ------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS build
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
FROM python:${PYTHON_VERSION}-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# The runtime dependencies come from the index (a pip cache mount keeps rebuilds from
# downloading them again); no compiler, no test dependencies in this image.
RUN --mount=type=secret,id=pip_conf --mount=type=secret,id=pip_cert --mount=type=cache,target=/root/.cache/pip \
    set -e; if [ -s /run/secrets/pip_conf ]; then export PIP_CONFIG_FILE=/run/secrets/pip_conf; fi; \
    pip install /wheels/*.whl; rm -rf /wheels; \
    useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin reducer
ENV PIP_NO_CACHE_DIR=1
# Numeric so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
# 2222: the data port (its CLUSTER_SPEC entry, Vertex AI's port); 2223: the gRPC control plane
# (health, GetStats, Drain), the data port + 1 unless --control-port / RS_CONTROL_PORT say otherwise.
EXPOSE 2222 2223
ENTRYPOINT ["reduction-server", "serve"]
