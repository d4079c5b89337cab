"""Example programs (the scenario consumer of inbox/CONTRACT.md)."""
