"""The gRPC wire without state: messages in and out, statuses, method handlers, addresses.

Belongs here: every mapping between protobuf messages and registry or report values
(`convert`, with the assembly's encodings in `encoding` and the reports' in
`report_messages`), every failure as a gRPC status (`status`), callers' JSON text
(`json_text`), the method handlers built from the descriptor (`handlers`) and the listen
addresses (`addresses`). It may import `registry/` and `reports/` only; `guard/`, `rpc/`,
`admin/` and `sidecar/` import it.
"""
