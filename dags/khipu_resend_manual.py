"""Khipu resend, by hand, of every stream: Khipu's operators' (each team has its own, khipu_resend_manual__<team>).

The DAG's whole description is its doc (khipu_airflow.resend.MANUAL_DOC): Airflow shows it on the DAG's page.
"""

from __future__ import annotations

from khipu_airflow.resend import manual_resend_dag

dag = manual_resend_dag()
