# syntax=docker/dockerfile:1
# Orthoplex: one image for the service (`orthoplex serve`) and for the Ray nodes (head and workers:
# Ray, torch and the engine inside). See docs/deploy.md.
#
#   CPU:   docker build -t orthoplex:0.1.0-cpu .
#   CUDA:  docker build --build-arg TORCH_VARIANT=cu128 -t orthoplex:0.1.0-cu128 .
#
# TORCH_VARIANT names a wheel index of PyTorch (cpu, or a CUDA flavour that lists torch 2.13.0, e.g.
# cu128); the CUDA build brings its CUDA runtime libraries as wheels, so both variants share the base.
# The base is pinned by digest (python 3.11.7, the version the test suite runs on).
ARG PYTHON_IMAGE=python:3.11.7-slim-bookworm@sha256:8f64a67710f3d981cf3008d6f9f1dbe61accd7927f165f4e37ea3f8b883ccc3f

# ---------------------------------------------------------------- build: a virtual environment
FROM ${PYTHON_IMAGE} AS build
ARG TORCH_VARIANT=cpu
ARG TORCH_VERSION=2.13.0
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PATH=/opt/orthoplex/bin:$PATH
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
COPY deploy/image/requirements.lock /tmp/requirements.lock
# torch first, from PyTorch's own index (CPU or CUDA build of the pinned version); the lock's
# torch==2.13.0 is then satisfied by it (2.13.0+cpu / 2.13.0+cu128) and pip installs no other build
RUN python -m venv /opt/orthoplex \
    && pip install --index-url "https://download.pytorch.org/whl/${TORCH_VARIANT}" "torch==${TORCH_VERSION}" \
    && pip install --requirement /tmp/requirements.lock
WORKDIR /src
COPY pyproject.toml README.md ./
COPY service ./service
COPY workers ./workers
COPY planner ./planner
COPY migrations ./migrations
COPY bench ./bench
RUN pip install --no-deps /src && python -I -c "import torch, ray, service.cli.main, workers, planner"

# ---------------------------------------------------------------- runtime: non-root, no compilers
FROM ${PYTHON_IMAGE} AS runtime
ARG TORCH_VARIANT=cpu
LABEL org.opencontainers.image.title="orthoplex" \
      org.opencontainers.image.description="Orthoplex service and Ray node image (torch ${TORCH_VARIANT})" \
      org.opencontainers.image.licenses="Apache-2.0"
# tini reaps the processes Ray leaves behind; procps gives Ray's tools `ps`
RUN apt-get update \
    && apt-get install -y --no-install-recommends tini=0.19.0-1+b3 procps=2:4.0.2-3 \
    && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 1000 orthoplex \
    && useradd --uid 1000 --gid 1000 --create-home --shell /bin/bash orthoplex \
    && mkdir -p /var/lib/orthoplex/storage \
    && chown -R 1000:1000 /var/lib/orthoplex
COPY --from=build /opt/orthoplex /opt/orthoplex
COPY --chmod=0755 deploy/image/orthoplex-service /usr/local/bin/orthoplex-service
ENV PATH=/opt/orthoplex/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    ORTHOPLEX_HOST=0.0.0.0 \
    ORTHOPLEX_PORT=8470 \
    ORTHOPLEX_STORAGE_PATH=/var/lib/orthoplex/storage \
    ORTHOPLEX_LOG_FORMAT=json
USER 1000:1000
WORKDIR /home/orthoplex
# 8470 the API; 6379 Ray's GCS, 8265 Ray's dashboard, 10001 Ray client (on a head)
EXPOSE 8470 6379 8265 10001
ENTRYPOINT ["/usr/bin/tini", "--"]
# the service; KubeRay replaces the command with its own `ray start` for head and worker pods
CMD ["orthoplex-service"]
