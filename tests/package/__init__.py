"""What ships: the server package's shape, the wheel, the container, manifests, docs."""
