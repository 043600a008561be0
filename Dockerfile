# One image for every service: the project, its pinned venv and the Delta jars (make setup).
# It runs as ckpt (uid:gid 50000:50000; 50000 is also the official apache/airflow image's uid), never
# as root: the code and the venv stay root's and read-only to it; it owns only what it writes.
FROM python:3.11-slim-bookworm
# The JDK, not only the runtime: set-up compiles the S3 log store with javac (Delta's commits on an
# s3:// warehouse, e.g. docker-compose's object store); without it such a warehouse is refused.
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jdk-headless make procps chromium \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --gid 50000 ckpt \
 && useradd --uid 50000 --gid 50000 --home-dir /home/ckpt --create-home --shell /usr/sbin/nologin ckpt
WORKDIR /opt/checkpoint_lib
COPY pyproject.toml constraints.txt Makefile README.md ./
COPY checkpoint_lib ./checkpoint_lib
COPY plugins ./plugins
RUN make setup PYTHON=python3.11
COPY . .
# What ckpt writes: the warehouse (a new named volume takes the owner of its mount point), the
# object store's data (docker-compose's objectstore), Airflow's AIRFLOW_HOME, the Spark configuration
# docker/entrypoint.sh writes (0700: it holds the auth secret), the Spark workers' work directories,
# and its home (the working directory: Spark creates spark-warehouse/ there).
RUN install -d -o ckpt -g ckpt -m 0755 /warehouse /objectstore /opt/airflow /opt/airflow/logs /home/ckpt/spark-work \
 && install -d -o ckpt -g ckpt -m 0700 /home/ckpt /home/ckpt/spark-conf
ENV PATH=/opt/checkpoint_lib/.venv/bin:$PATH \
    CKPT_WAREHOUSE=/warehouse \
    HOME=/home/ckpt \
    SPARK_CONF_DIR=/home/ckpt/spark-conf \
    SPARK_WORKER_DIR=/home/ckpt/spark-work
USER 50000:50000
WORKDIR /home/ckpt
# Spark authentication from SPARK_AUTH_SECRET (docker-compose.yml), then the service's command.
ENTRYPOINT ["/bin/sh", "/opt/checkpoint_lib/docker/entrypoint.sh"]
