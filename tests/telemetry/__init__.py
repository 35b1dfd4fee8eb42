"""What the sidecar tells its operator: metrics, logs, traces."""
