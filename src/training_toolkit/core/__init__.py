"""The toolkit's vocabulary, used by every layer: its errors and log, the records a host writes, redaction, the
names of the contract, the hardware it sees and the paths under ``/opt/ml``.  Imports nothing of the toolkit's
but itself.
"""
