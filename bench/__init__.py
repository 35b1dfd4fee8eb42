"""The benchmark suite: `make bench` (or `python -m bench`) measures, prints, records.

Figures are ratios against baselines measured in the same run, interleaved with
the operation they are compared to, because absolute times on shared machines
move from one run to the next; the absolute times are reported as context.
"""

import os

# grpc's C core logs connection events (GOAWAY when a sidecar stops) at INFO;
# they would interleave with the table. GRPC_VERBOSITY=... in the environment wins.
os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
