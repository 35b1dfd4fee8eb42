"""What the wire carries: statuses and error details, protocol versions, version skew."""
