"""gRPC core's own log lines stay out of the agent's stderr unless asked for.

Imported before grpc: the core reads GRPC_VERBOSITY once, when it loads. Setting
GRPC_VERBOSITY (debug, info, error) in the environment brings them back.
"""

import os

os.environ.setdefault("GRPC_VERBOSITY", "NONE")
