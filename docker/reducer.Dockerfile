# syntax=docker/dockerfile:1
# The reducer node image: a CPU-only `reduction-server serve` (Vertex AI pool 2, or the
# StatefulSet in examples/kubernetes/). Build from the repository root:
#   docker build -f docker/reducer.Dockerfile -t reduction-server/reducer:latest .
# The reducer finds its port and peers in CLUSTER_SPEC / TF_CONFIG / RS_* (docs/configuration.md).
ARG PYTHON_VERSION=3.11

# -- build: compile the C++ core into a wheel ------------------------------------------------
FROM python:${PYTHON_VERSION}-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ libssl-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
# Drop any build tree from the host so the extension is compiled here, for this image's glibc.
RUN rm -rf build dist ./*.egg-info \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- runtime ---------------------------------------------------------------------------------
FROM python:${PYTHON_VERSION}-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels \
    && useradd --system --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin reducer
# Numeric so that Kubernetes' runAsNonRoot can verify it.
USER 10001:10001
EXPOSE 2222
ENTRYPOINT ["reduction-server", "serve"]
