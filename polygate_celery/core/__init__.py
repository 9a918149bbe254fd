"""Decision core: budgets, stall clock, backoff, breaker, AIMD, quotas and selection.

Pure: no I/O, no reading of time (time is passed in), no randomness (draws are
passed in). Everything else in the package is built on top of this layer.
"""
