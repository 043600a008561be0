# One image for every service: the project, its pinned venv and the Delta jars (make setup).
FROM python:3.11-slim-bookworm
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless maven make procps chromium \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /opt/checkpoint_lib
COPY pyproject.toml constraints.txt Makefile README.md ./
COPY checkpoint_lib ./checkpoint_lib
RUN make setup PYTHON=python3.11
COPY . .
ENV PATH=/opt/checkpoint_lib/.venv/bin:$PATH \
    CKPT_WAREHOUSE=/warehouse
