#!/bin/sh
# The entry point of every container of this image (Dockerfile, docker-compose.yml).
#
# With SPARK_AUTH_SECRET set (docker-compose.yml takes it from .env for every service that runs
# Spark: the master, the workers, and the drivers of the scheduler's tasks and `ckpt demo`), Spark's
# RPC authentication is turned on for whatever Spark this container runs: Spark reads
# `spark.authenticate` and `spark.authenticate.secret` from $SPARK_CONF_DIR/spark-defaults.conf
# (the master and workers at start, spark-submit and pyspark for every driver), written here
# readable by this user only. So the secret is on no command line (ps, the `running spark-submit
# ...` line of a task log), in no image layer, and gone from the environment of what runs next.
# Spark hands it to the executors it starts itself.
#
# tests/airflow/test_compose.py runs this script (and, with -m slow, a master and workers with it).
set -eu

if [ -n "${SPARK_AUTH_SECRET:-}" ]; then
  case "$SPARK_AUTH_SECRET" in
    *[!A-Za-z0-9._~+/=-]*)
      # spark-defaults.conf is a Java properties file: keep the value free of escapes and spaces
      echo "entrypoint: SPARK_AUTH_SECRET may hold only A-Z a-z 0-9 . _ ~ + / = - (e.g. openssl rand -hex 32)" >&2
      exit 64 ;;
  esac
  if [ "${#SPARK_AUTH_SECRET}" -lt 32 ]; then
    echo "entrypoint: SPARK_AUTH_SECRET is too short (at least 32 characters, e.g. openssl rand -hex 32)" >&2
    exit 64
  fi
  : "${SPARK_CONF_DIR:?entrypoint: SPARK_CONF_DIR must name the directory of spark-defaults.conf}"
  umask 077
  mkdir -p "$SPARK_CONF_DIR"
  printf 'spark.authenticate true\nspark.authenticate.secret %s\n' "$SPARK_AUTH_SECRET" \
    > "$SPARK_CONF_DIR/spark-defaults.conf.tmp"
  mv -f "$SPARK_CONF_DIR/spark-defaults.conf.tmp" "$SPARK_CONF_DIR/spark-defaults.conf"
  unset SPARK_AUTH_SECRET
fi

exec "$@"
