"""The gRPC face of the registry: messages in, values through, messages and statuses out.

Belongs here: every mapping between protobuf messages and registry values (`convert`), every
failure as a gRPC status (`status`), the method handlers, the bearer-token check, the drain
gate, the encoded-response cache, the long-lived streams' brokers (`streams/`) and the
servicer (`service`), which only translates and delegates. It may import `registry/`,
`reports/` and `telemetry/`; `admin/` and `sidecar/` import it. Inside, `streams/` never
imports `service`.
"""
