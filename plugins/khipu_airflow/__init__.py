"""Khipu's Airflow integration: hooks that turn Airflow connections into Khipu clients.

Airflow puts the plugins folder on ``sys.path``, so DAGs import this as ``khipu_airflow``.
"""
