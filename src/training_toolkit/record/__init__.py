"""The job's record: what happened and when (``schema``, ``observe``), what it cost (``cost``), in one line (``summary``).

docs/resilience.md, "The job's record", documents the format and every field.
"""
