"""Where a submission runs: the jail (sandbox/), its kernel and cells (execute.py), the limits it runs under, and the proof that the jail works (preflight.py)."""
