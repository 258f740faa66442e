# nasflow on CPU. Build:  docker build -t nasflow .
# Run a search:           docker run --rm -v "$PWD/runs:/app/runs" nasflow
# Any overrides:          docker run --rm nasflow search strategy=random budget.trials=50
# (No Docker engine runs on the project's CI machines; this file is kept
# correct by reading it against the Makefile and pyproject.toml.)
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    NASFLOW_HOME=/app/.nasflow \
    MPLBACKEND=Agg

WORKDIR /app
# Dependencies first, so code edits do not re-install torch.
COPY pyproject.toml README.md ./
COPY nas/__init__.py nas/__init__.py
COPY supernets/__init__.py supernets/__init__.py
COPY tasks/__init__.py tasks/__init__.py
COPY flows/__init__.py flows/__init__.py
COPY conf/__init__.py conf/__init__.py
RUN pip install --upgrade pip \
    && pip install .

COPY nas nas
COPY supernets supernets
COPY tasks tasks
COPY flows flows
COPY conf conf
# The deployments: `nas serve` in /app reads it; a Docker or Kubernetes work pool runs them here.
COPY prefect.yaml prefect.yaml
RUN pip install --no-deps --force-reinstall . && nas --help >/dev/null

VOLUME ["/app/runs", "/app/.nasflow"]
ENTRYPOINT ["nas"]
CMD ["search"]
