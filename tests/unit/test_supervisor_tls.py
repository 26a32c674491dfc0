"""A job's credentials, and the TLS its supervisors speak with them: made right, checked with clear
errors, and every connection without them refused, counted, said once per peer, and timed out."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
import stat
from collections.abc import Callable
from pathlib import Path

import pytest
from slicekeeper.supervisor import tls as job_tls
from slicekeeper.supervisor.checkpoints.peer_tier import (
    ReplicaServer,
    ReplicaStore,
    fetch_replica,
    push_replica,
)
from slicekeeper.supervisor.tls import JobTls

from slicekeeper import credentials
from slicekeeper.credentials import CredentialsError
from tests.support.shard_folders import contents, files_of, make_folder


@pytest.fixture(scope="module")
def job_credentials() -> credentials.JobCredentials:
    return credentials.generate("tiny-lm")


@pytest.fixture
def own(tmp_path: Path, job_credentials: credentials.JobCredentials) -> Path:
    return job_credentials.write(tmp_path / "own")


class Refusals:
    def __init__(self) -> None:
        self.counted: list[str] = []
        self.said: list[str] = []

    def tls(self, directory: Path) -> JobTls:
        return JobTls(directory, refused=self.counted.append, say=self.said.append)


def test_the_credentials_are_written_for_their_user_alone(own: Path):
    assert stat.S_IMODE(own.stat().st_mode) == 0o700
    for name in credentials.FILES:
        assert stat.S_IMODE((own / name).stat().st_mode) == 0o600, name
    credentials.check(own)


def test_credentials_that_do_not_belong_together_are_refused_naming_the_file(tmp_path: Path, own: Path):
    other = credentials.generate("another-job").write(tmp_path / "other")
    (own / credentials.KEY_FILE).unlink()
    with pytest.raises(CredentialsError, match=r"own/tls\.key: the job's credentials cannot be read"):
        credentials.check(own)
    (own / credentials.KEY_FILE).write_bytes((other / credentials.KEY_FILE).read_bytes())
    with pytest.raises(CredentialsError, match=r"tls\.key: not the key of the certificate"):
        credentials.check(own)
    (own / credentials.CERT_FILE).write_bytes((other / credentials.CERT_FILE).read_bytes())
    with pytest.raises(CredentialsError, match=r"tls\.crt: not signed by the CA in ca\.crt"):
        credentials.check(own)
    (own / credentials.CA_FILE).write_text("not a certificate")
    with pytest.raises(CredentialsError, match=r"ca\.crt: not a PEM certificate"):
        credentials.check(own)


def test_the_job_certificate_is_no_ca_and_the_ca_key_is_gone(job_credentials):
    from cryptography import x509

    cert = x509.load_pem_x509_certificate(job_credentials.cert)
    assert cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca is False
    assert set(job_credentials.files()) == {"ca.crt", "tls.crt", "tls.key"}  # no key of the CA kept


async def _peers(
    tmp_path: Path,
    server_tls: JobTls | None,
    client_tls: JobTls | None,
    settled: Callable[[], bool] = lambda: True,
) -> dict[str, bytes]:
    """Push host 3's step 5 to a replica server and fetch it back; the files fetched. The server
    stays up until `settled()` (at most 5 s): its side of a refusal may end after the client's."""
    server = ReplicaServer(ReplicaStore(tmp_path / "replicas", keep=2), tls=server_tls)
    address = f"127.0.0.1:{await server.serve('127.0.0.1', 0)}"
    try:
        folder = make_folder(tmp_path / "local", 5, contents(5))
        await push_replica(address, 3, folder, timeout=5, tls=client_tls)
        await fetch_replica(address, 3, 5, tmp_path / "fetched", timeout=5, tls=client_tls)
    finally:
        for _ in range(500):
            if settled():
                break
            await asyncio.sleep(0.01)
        await server.close()
    return files_of(tmp_path / "fetched" / "step-00000005")


def test_peers_with_the_jobs_credentials_push_and_fetch_over_tls(tmp_path: Path, own: Path):
    refusals = Refusals()
    fetched = asyncio.run(_peers(tmp_path, refusals.tls(own), refusals.tls(own)))
    assert fetched == files_of(tmp_path / "local" / "step-00000005")
    assert refusals.counted == [] and refusals.said == []


@pytest.mark.parametrize("client", ["plain", "another job's"])
def test_a_peer_without_the_jobs_credentials_gets_nothing_and_is_counted(tmp_path: Path, own: Path, client):
    refusals = Refusals()
    other = credentials.generate("another-job").write(tmp_path / "other")
    client_tls = None if client == "plain" else JobTls(other)
    with pytest.raises(Exception, match="push of host 3 step 5"):
        asyncio.run(_peers(tmp_path, refusals.tls(own), client_tls, settled=lambda: bool(refusals.counted)))
    assert refusals.counted == ["peer"]
    assert not (tmp_path / "replicas").exists() or not any((tmp_path / "replicas").rglob("*.bin"))


def test_without_tls_the_same_plain_peer_gets_in(tmp_path: Path):
    """The negative control of the test above: the refusal is TLS's doing."""
    assert asyncio.run(_peers(tmp_path, None, None)) == files_of(tmp_path / "local" / "step-00000005")


async def _connect_plainly(port: int, payload: bytes) -> bytes:
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(payload)
    answer = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    return answer


def test_refusals_are_each_counted_and_said_once_per_peer(own: Path):
    refusals = Refusals()

    async def scenario() -> list[bytes]:
        server = ReplicaServer(ReplicaStore(own.parent / "replicas", keep=2), tls=refusals.tls(own))
        port = await server.serve("127.0.0.1", 0)
        try:
            return [
                await _connect_plainly(port, b'{"op": "fetch", "owner": 0, "step": 1}\n') for _ in range(3)
            ]
        finally:
            await server.close()

    assert asyncio.run(scenario()) == [b"", b"", b""]
    assert refusals.counted == ["peer"] * 3
    [said] = refusals.said
    assert said.startswith("refused a connection from 127.0.0.1 to the peer port: no valid credentials")


def test_a_client_that_never_completes_the_handshake_is_dropped(own: Path, monkeypatch):
    monkeypatch.setattr(job_tls, "HANDSHAKE_SECONDS", 0.3)
    refusals = Refusals()

    async def scenario() -> bytes:
        server = ReplicaServer(ReplicaStore(own.parent / "replicas", keep=2), tls=refusals.tls(own))
        port = await server.serve("127.0.0.1", 0)
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)  # and then silence
            answer = await asyncio.wait_for(reader.read(), 5)
            writer.close()
            return answer
        finally:
            await server.close()

    assert asyncio.run(scenario()) == b""
    assert refusals.counted == ["peer"] and "taking longer than 0.3 seconds" in refusals.said[0]


def test_only_tls_1_3_is_spoken(own: Path):
    tls = JobTls(own)
    assert tls.server.minimum_version == tls.client.minimum_version == ssl.TLSVersion.TLSv1_3
    assert tls.server.verify_mode == tls.client.verify_mode == ssl.CERT_REQUIRED


def _handshake_in_memory(server_context: ssl.SSLContext, client_context: ssl.SSLContext) -> ssl.SSLObject:
    """A whole handshake between the two contexts, and the client's read of what followed it."""
    to_server, to_client, from_server, from_client = (ssl.MemoryBIO() for _ in range(4))
    server = server_context.wrap_bio(to_server, from_server, server_side=True)
    client = client_context.wrap_bio(to_client, from_client, server_side=False)
    for _ in range(10):
        for side in (client, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                side.do_handshake()
            to_server.write(from_client.read())
            to_client.write(from_server.read())
    with contextlib.suppress(ssl.SSLWantReadError):
        client.read(1)  # the session tickets, if the server sent any
    return client


@pytest.mark.parametrize("tickets", [None, 2], ids=["job's server", "negative control: OpenSSL's default"])
def test_the_server_issues_no_session_ticket(own: Path, tickets: int | None):
    """No client of a job resumes a session, and two tickets were 40 % of a handshake's CPU on the
    server, which a new leader pays once for every member (benchmarks/tls_handshake.py)."""
    tls = JobTls(own)
    if tickets is not None:
        tls.server.num_tickets = tickets
    client = _handshake_in_memory(tls.server, tls.client)
    assert client.version() == "TLSv1.3" and client.getpeercert() is not None
    assert client.session is not None and client.session.has_ticket is (tickets is not None)


def test_the_handshake_benchmark_prices_each_variant(capsys: pytest.CaptureFixture[str]):
    from benchmarks import tls_handshake

    assert tls_handshake.main(["--handshakes", "3", "--rounds", "1"]) == 0
    figures = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    for variant in tls_handshake.VARIANTS:
        assert figures[variant]["server_ms"] > 0 and figures[variant]["client_ms"] > 0
