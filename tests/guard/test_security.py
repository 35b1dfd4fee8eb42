"""Security: bearer-token auth on every call and stream, TLS and mutual TLS."""

from __future__ import annotations

import subprocess
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import dsh_system_prompt as dsp
import grpc
import grpc.aio
import pytest
from dsh.systemprompt.v1 import system_prompt_pb2 as pb
from dsh.systemprompt.v1 import system_prompt_pb2_grpc as pb_grpc
from dsh_system_prompt_server import Sidecar
from grpc_health.v1 import health_pb2, health_pb2_grpc
from helpers import SidecarFactory, raw_channel, raw_stub, rejection, section_names
from processes import serve, sidecar_command

Next = Callable[[], Awaitable[dsp.PromptAssembly]]
TOKEN = "s3cret-token-for-tests"


@pytest.fixture
def token_file(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    return str(path)


@dataclass(frozen=True)
class Certificates:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path

    def client_tls(self, with_client_cert: bool = False) -> dsp.TLS:
        return dsp.TLS(
            root_certificates=self.ca.read_bytes(),
            private_key=self.client_key.read_bytes() if with_client_cert else None,
            certificate_chain=self.client_cert.read_bytes() if with_client_cert else None,
        )


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    """A throwaway CA, a server certificate for localhost/127.0.0.1 and a client one."""
    folder = tmp_path_factory.mktemp("pki")

    def openssl(command: str) -> None:  # no argument holds a space
        subprocess.run(["openssl", *command.split()], cwd=folder, check=True, capture_output=True)

    openssl(
        "req -x509 -newkey rsa:2048 -nodes -days 2 -subj /CN=test-ca -keyout ca.key -out ca.pem"
    )
    for name, extension in (
        ("server", "subjectAltName=DNS:localhost,IP:127.0.0.1"),
        ("client", "extendedKeyUsage=clientAuth"),
    ):
        openssl(f"req -newkey rsa:2048 -nodes -subj /CN={name} -keyout {name}.key -out {name}.csr")
        (folder / f"{name}.ext").write_text(extension + "\n")
        openssl(
            f"x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2"
            f" -extfile {name}.ext -out {name}.pem"
        )
    return Certificates(
        folder / "ca.pem",
        folder / "server.pem",
        folder / "server.key",
        folder / "client.pem",
        folder / "client.key",
    )


async def test_without_a_token_every_call_is_unauthenticated(
    make_sidecar: SidecarFactory, token_file: str
) -> None:
    sidecar = await make_sidecar(auth_token_file=token_file)
    error = await rejection(dsp.connect(sidecar.address))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED


async def test_a_wrong_token_is_unauthenticated(
    make_sidecar: SidecarFactory, token_file: str
) -> None:
    sidecar = await make_sidecar(auth_token_file=token_file)
    error = await rejection(dsp.connect(sidecar.address, token="not-the-token"))
    assert error.code == grpc.StatusCode.UNAUTHENTICATED
    assert "bearer token" in str(error)


async def test_the_right_token_opens_sessions_streams_and_calls(
    make_sidecar: SidecarFactory, token_file: str
) -> None:
    sidecar = await make_sidecar(auth_token_file=token_file)
    async with dsp.connect(sidecar.address, token=TOKEN) as client:
        changes = await client.watch_changes()
        await client.section("rules", 1, lambda ctx: "dynamic over an authenticated stream")

        async def listener(
            assembly: dsp.PromptAssembly, ctx: dsp.AssembleContext, next_: Next
        ) -> Awaitable[dsp.PromptAssembly]:
            return next_()

        await client.on_assemble(listener)
        assembly = await client.assemble()
        await changes.close()
    assert "rules" in section_names(assembly)


async def test_unary_calls_and_watch_streams_without_a_token_are_refused(
    make_sidecar: SidecarFactory, token_file: str
) -> None:
    sidecar = await make_sidecar(auth_token_file=token_file)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        stub = pb_grpc.SystemPromptServiceStub(channel)
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.Assemble(pb.AssembleRequest())
        watch = stub.WatchChanges(pb.WatchChangesRequest())
        with pytest.raises(grpc.aio.AioRpcError) as streamed:
            await watch.read()
    assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_health_answers_without_a_token_for_the_platforms_probes(
    make_sidecar: SidecarFactory, token_file: str
) -> None:
    sidecar = await make_sidecar(auth_token_file=token_file)
    async with grpc.aio.insecure_channel(sidecar.address) as channel:
        reply = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest())
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_serve_takes_the_token_file_flag(token_file: str) -> None:
    async with serve("--listen", "127.0.0.1:0", "--auth-token-file", token_file) as served:
        error = await rejection(dsp.connect(served.address))
        async with dsp.connect(served.address, token=TOKEN) as client:
            await client.assemble()
    assert error.code == grpc.StatusCode.UNAUTHENTICATED


async def test_tls_serves_a_client_that_trusts_the_ca(
    make_sidecar: SidecarFactory, certificates: Certificates
) -> None:
    sidecar = await make_sidecar(
        tls_cert_file=str(certificates.server_cert), tls_key_file=str(certificates.server_key)
    )
    address = sidecar.address.replace("127.0.0.1", "localhost")
    async with dsp.connect(address, tls=certificates.client_tls()) as client:
        await client.section("over-tls", 1, "encrypted")
        assert "over-tls" in section_names(await client.assemble())


async def test_tls_refuses_a_plaintext_client(
    make_sidecar: SidecarFactory, certificates: Certificates
) -> None:
    sidecar = await make_sidecar(
        tls_cert_file=str(certificates.server_cert), tls_key_file=str(certificates.server_key)
    )
    error = await rejection(dsp.connect(sidecar.address))
    assert error.code == grpc.StatusCode.UNAVAILABLE


async def test_mutual_tls_requires_a_client_certificate(
    make_sidecar: SidecarFactory, certificates: Certificates
) -> None:
    sidecar = await make_sidecar(
        tls_cert_file=str(certificates.server_cert),
        tls_key_file=str(certificates.server_key),
        tls_client_ca_file=str(certificates.ca),
    )
    address = sidecar.address.replace("127.0.0.1", "localhost")
    await rejection(dsp.connect(address, tls=certificates.client_tls(with_client_cert=False)))
    async with dsp.connect(address, tls=certificates.client_tls(with_client_cert=True)) as client:
        await client.assemble()


async def test_registration_and_session_ids_are_unguessable(
    sidecar: Sidecar, client: dsp.Client
) -> None:
    for index in range(50):
        await client.section(f"s{index}", index, "x")
    ids = {client.session_id} | {
        entry.id for entry in sidecar.registry.registrations(owner=client.session_id)
    }
    assert len(ids) == 51
    assert all(len(identifier) >= 22 for identifier in ids)  # >= 128 random bits


# -- coherent security config -----------------------------------------------------------


def _serve_refused(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sidecar_command(), "serve", "--listen", "127.0.0.1:0", *args],
        capture_output=True,
        text=True,
        timeout=15,
        check=False,
    )


def test_a_client_ca_without_a_server_certificate_is_a_config_error(
    certificates: Certificates,
) -> None:
    result = _serve_refused("--tls-client-ca", str(certificates.ca))
    assert result.returncode == 2
    assert "'tls_client_ca_file'" in result.stderr and "'tls_cert_file'" in result.stderr
    assert "listening on" not in result.stdout


def test_a_key_that_does_not_match_the_certificate_is_a_config_error(
    certificates: Certificates,
) -> None:
    result = _serve_refused(
        "--tls-cert", str(certificates.server_cert), "--tls-key", str(certificates.client_key)
    )
    assert result.returncode == 2
    assert f"'tls_key_file': {certificates.client_key}" in result.stderr
    assert "listening on" not in result.stdout


@pytest.mark.parametrize("scheme", ["bearer", "BEARER", "Bearer", "bEaReR"])
async def test_the_bearer_scheme_is_case_insensitive(
    make_sidecar: SidecarFactory, token_file: str, scheme: str
) -> None:
    sidecar = await make_sidecar(auth_token_file=token_file)
    async with raw_channel(sidecar.address) as channel:
        reply = await raw_stub(channel).Assemble(
            pb.AssembleRequest(), metadata=(("authorization", f"{scheme} {TOKEN}"),), timeout=5
        )
    assert reply.assembly.sections


async def test_the_token_itself_stays_case_sensitive(
    make_sidecar: SidecarFactory, token_file: str
) -> None:
    sidecar = await make_sidecar(auth_token_file=token_file)
    async with raw_channel(sidecar.address) as channel:
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await raw_stub(channel).Assemble(
                pb.AssembleRequest(),
                metadata=(("authorization", f"Bearer {TOKEN.upper()}"),),
                timeout=5,
            )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED


async def test_under_mutual_tls_a_client_certificate_names_its_credential(
    make_sidecar: SidecarFactory, certificates: Certificates, token_file: str
) -> None:
    sidecar = await make_sidecar(
        tls_cert_file=str(certificates.server_cert),
        tls_key_file=str(certificates.server_key),
        tls_client_ca_file=str(certificates.ca),
        auth_token_file=token_file,
        credentials=[{"name": "dashboard", "role": "reader", "client_certificate": "client"}],
    )
    address = sidecar.address.replace("127.0.0.1", "localhost")
    async with dsp.connect(address, tls=certificates.client_tls(with_client_cert=True)) as client:
        snapshot = await client.snapshot()  # no token: the certificate's CN is the credential
        refused = await rejection(client.section("notes", 1, "A reader never writes."))
    assert snapshot.revision > 0
    assert refused.reason is dsp.Reason.PERMISSION_DENIED
    assert 'credential "dashboard" (reader) may not register' in str(refused)
