"""Who may call, and when: credentials and their roles, each request as the policy sees it,
each client's fair share of the event loop, and the drain gate that refuses new calls once
the sidecar is stopping.

Imports the registry and `rpc`'s translation modules (`status`); imported by the streams, the
servicer, the admin page and the sidecar.
"""
