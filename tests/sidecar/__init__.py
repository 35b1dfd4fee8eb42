"""The process: serve, the other commands, config reloads."""
