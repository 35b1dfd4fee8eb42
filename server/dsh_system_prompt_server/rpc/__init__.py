"""The gRPC face of the registry: messages in, values through, messages and statuses out.

Belongs here: every mapping between protobuf messages and registry values (`convert`, with the
assembly's wire encodings in `encoding` and the reports' in `report_messages`), every failure as
a gRPC status (`status`), the method handlers, listen addresses; who may call (`guard/`); the
Assemble RPC answered (`assemble/`); the long-lived streams' brokers (`streams/`); the state both
faces take (`state`: built once, read by the admin page too) and the servicer (`service`), which
only translates and delegates. It may import `registry/`, `reports/` and `telemetry/`; `admin/`
and `sidecar/` import it. Inside, lowest first: the translation modules here, `guard/`,
`assemble/`, `streams/`, `state`, `service`; each imports only those before it.
"""
