-- Run once by the postgres image on a new data volume (docker-compose.yml): the database PostgreSQL
-- sinks write into, owned by the compose user (the Airflow metadata database is `airflow`).
CREATE DATABASE sinks OWNER airflow;
