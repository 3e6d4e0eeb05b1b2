-- Khipu reference stack (docker-compose.yaml): runs once, when the PostgreSQL data volume is empty.
-- The official postgres image has already created the Airflow metadata database and its owner
-- (POSTGRES_DB / POSTGRES_USER). This script adds the Khipu store: its own role and database.
-- The password is read from the container's STORE_DB_PASSWORD variable (psql \getenv, PostgreSQL 15+),
-- so no secret is written in this file.

\getenv store_db_password STORE_DB_PASSWORD

CREATE ROLE khipu WITH LOGIN PASSWORD :'store_db_password';
CREATE DATABASE khipu OWNER khipu;
REVOKE ALL ON DATABASE khipu FROM PUBLIC;
GRANT ALL PRIVILEGES ON DATABASE khipu TO khipu;
