"""Prompt-cache reports: provenance, sizes, prefix stability, blame, history per key."""
