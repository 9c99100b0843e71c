# One image for the Python side (speed layer, API, analytics, archiver, Airflow), built like a fresh
# checkout: the project with its locked dependencies (`uv sync --locked`, uv.lock) and the
# checksum-verified jars (infra/jvm). docker-compose.yml builds and runs it; tests/integration/local/test_compose.py
# resolves every command against it and checks with apt-cache that each package installed below
# exists in the base's Debian release. No image is built in CI (no Docker engine there).
# The base is pinned to a Debian release, the one the project's machines run: `python:3.11-slim`
# alone follows Debian's newest (trixie since August 2025, which ships no openjdk-17).
FROM python:3.11-slim-bookworm

COPY --from=ghcr.io/astral-sh/uv:0.13.8 /uv /uvx /bin/
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven make redis-tools \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# bytecode compiled at install: no process compiles the dependencies again at start
ENV UV_LINK_MODE=copy UV_PYTHON_DOWNLOADS=never UV_COMPILE_BYTECODE=1
# Dependencies first, so code changes do not refetch them.
COPY pyproject.toml uv.lock .python-version ./
RUN uv sync --locked --no-install-project
COPY infra/ infra/
RUN .venv/bin/python -m infra.jars fetch && rm -rf .cache/m2

COPY . .
RUN uv sync --locked
# the Spark drivers' class archive for this image's JDK and jar paths, as `make setup` dumps it
RUN .venv/bin/python -m pipelines.spark class-archive
ENV SOCIAL_VAR_DIR=/app/var
