"""The operator: kopf wiring (handlers.py) around the tuning loop of one run (tuner.py)."""
