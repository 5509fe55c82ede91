# syntax=docker/dockerfile:1
# A GPU worker image: PyTorch + this package (`pip install .[torch]`) + the examples.
# Build from the repository root:
#   docker build -f docker/worker.Dockerfile -t reduction-server/worker:latest .
# Pick another PyTorch base with --build-arg BASE=pytorch/pytorch:<tag>; the build and
# runtime stages must use the same base (same Python).
ARG BASE=pytorch/pytorch:2.5.1-cuda12.4-cudnn9-runtime

# -- build: compile the C++ core into a wheel (the runtime base has no compiler) --------------
FROM ${BASE} AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends g++ \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY . .
RUN rm -rf build dist ./*.egg-info \
    && pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

# -- runtime ---------------------------------------------------------------------------------
FROM ${BASE}
ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
COPY --from=build /wheels /wheels
# The [torch] extra is already satisfied by the base image's torch; pip keeps it.
RUN set -e; whl="$(ls /wheels/*.whl)"; pip install "${whl}[torch]"; rm -rf /wheels
WORKDIR /opt/reduction-server
COPY examples/ examples/
EXPOSE 2222
# No ENTRYPOINT: Vertex AI containerSpec.args / Kubernetes args give the whole command.
CMD ["python", "examples/allreduce_numpy.py"]
