"""A stall, seen and named: every rank's stack when the job stops making progress (``stacks``), the one-line
report of where each rank is (``stackreport``), and the hook a rank's Python loads to answer (``stackhook``).
"""
