# One image for the Python side (speed layer, API, Airflow), built exactly like a fresh checkout:
# `make setup` installs the pinned Python deps (requirements.lock) and the checksum-verified jars.
FROM python:3.11-slim

RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven make redis-tools \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
# Dependency manifests first, so code changes do not refetch dependencies.
COPY requirements.lock pyproject.toml Makefile ./
COPY infra/ infra/
RUN make .venv/.installed && .venv/bin/python -m infra.jars fetch && rm -rf .cache/m2

COPY . .
ENV SOCIAL_VAR_DIR=/app/var
