"""Rules: waterfall steps the sidecar runs itself, in CEL, with no hop (docs/protocol.md,
"Rules"): each mutation, match and variables, refusals at registration, failures at run time
under each policy, the order among listeners, ownership and lifetime, the operator's config
rules with reloads, reuse of kept responses, and the Python client's API."""
