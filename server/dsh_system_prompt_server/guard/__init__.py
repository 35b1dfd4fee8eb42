"""Who may call, and when: credentials and their roles, each request as the policy sees it,
each client's fair share of the event loop, and the drain gate that refuses new calls once
the sidecar is stopping.

Imports `registry/` and `wire/` (`handlers`, `status`); imported by `rpc/` (the streams,
the state, the servicer), `admin/` and `sidecar/`.
"""
