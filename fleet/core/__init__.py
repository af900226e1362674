"""The protocol core: the store, runs and items, leases and claims, the worker, status,
verification and following. It imports neither the GCE wing nor the CLI (tests/test_wings.py)."""
