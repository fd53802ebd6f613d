"""How the hosts of one job reach each other: the control channel and per-job SSH."""
