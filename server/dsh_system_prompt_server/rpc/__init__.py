"""The gRPC face of the registry: messages in, values through, messages and statuses out.

Belongs here: every mapping between protobuf messages and registry values (`convert`), every
failure as a gRPC status (`status`), the method handlers, the bearer-token check, listen
addresses, the drain gate, the encoded-response cache, the long-lived streams' brokers
(`streams/`), the state both faces take (`state`: built once, read by the admin page too)
and the servicer (`service`), which only translates and delegates. It may import
`registry/`, `reports/` and `telemetry/`; `admin/` and `sidecar/` import it. Inside,
`streams/` never imports `state` or `service`, and `state` never imports `service`.
"""
