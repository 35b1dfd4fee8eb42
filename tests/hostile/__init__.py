"""Hostile peers and input: bounds, idle connections, ejection, errors, peer text."""
