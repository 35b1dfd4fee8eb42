"""The gRPC server's options that bound what each connection costs the sidecar: each
session is a connection of its own (the client's local subchannel pool), so what gRPC
keeps per connection is paid per session."""

from __future__ import annotations

from dsh_system_prompt_server import parse_config
from dsh_system_prompt_server.sidecar.app import server_options


def test_connections_keep_no_channelz_node_and_no_zerocopy_send_records() -> None:
    options = dict(server_options(parse_config({})))
    # nothing serves channelz; zerocopy sends are off, yet gRPC allocated their records
    assert options["grpc.enable_channelz"] == 0
    assert options["grpc.experimental.tcp_tx_zerocopy_max_simultaneous_sends"] == 0
