"""The dsh-system-prompt sidecar: the registry served over gRPC."""
