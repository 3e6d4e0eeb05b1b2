"""The local stack: the embedded broker, Airflow standalone and the demo pipeline, as processes.

This package's whole job is starting and stopping local processes; nothing else imports it.
"""
