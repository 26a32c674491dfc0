"""A job's own credentials: the certificate authority and the certificate its supervisors share.

Every connection between a job's supervisors (the leader protocol, the peer tier) is TLS, mutually
authenticated: each side shows a certificate signed by the job's CA and accepts only one signed by
it. The CA is made for one job, by the operator (stored in a Secret owned by the TrainingJob, mounted
into that job's pods alone) or by `slicekeeper run` (in the run's directory, readable by its user
only), and its private key is thrown away once the job's certificate is signed: nothing can sign
another. So holding the job's certificate and key means being one of the job's supervisors; a pod of
another job, or of another tenant, holds none, and a connection of its is refused during the
handshake, before a message is read (supervisor.tls).

Host names are not checked: every supervisor of a job holds the same certificate (a spare takes any
host over, and the leader moves between hosts), and peers are reached by addresses the lease or the
leader hands out. What is proven is membership of the job, which is what the supervisors trust each
other for.

The files are those of a `kubernetes.io/tls` Secret: `tls.crt`, `tls.key`, and `ca.crt`.
Made with `cryptography` (ECDSA P-256, SHA-256); nothing here is home-made cryptography.
"""

from __future__ import annotations

import datetime
import os
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_FILE = "ca.crt"
CERT_FILE = "tls.crt"
KEY_FILE = "tls.key"
FILES = (CA_FILE, CERT_FILE, KEY_FILE)
VALID_DAYS = 3650
"""The job's certificates outlive any training run: they are never renewed (nothing rotates them
yet: docs/security.md), and they die with the job (the operator deletes the Secret with it)."""


class CredentialsError(ValueError):
    """The job's credentials are missing or unusable; the message names the file and what is wrong."""


@dataclass(frozen=True)
class JobCredentials:
    """PEM bytes of a job's CA certificate, its certificate, and that certificate's private key."""

    ca: bytes
    cert: bytes
    key: bytes

    def files(self) -> dict[str, bytes]:
        """File name -> content, as written to a directory and stored in a Secret."""
        return {CA_FILE: self.ca, CERT_FILE: self.cert, KEY_FILE: self.key}

    def write(self, directory: Path) -> Path:
        """Into `directory` (made if missing), readable and writable by this user only."""
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        directory.chmod(0o700)
        for name, content in self.files().items():
            path = directory / name
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as file:
                file.write(content)
        return directory


def generate(job_name: str, *, now: datetime.datetime | None = None) -> JobCredentials:
    """A new CA for `job_name` and one certificate it signs, for servers and clients alike."""
    start = (now or datetime.datetime.now(datetime.UTC)) - datetime.timedelta(minutes=5)
    end = start + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"slicekeeper job {job_name} CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"slicekeeper job {job_name}")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(f"*.{job_name}")]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return JobCredentials(
        ca=ca.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def _usage(*, cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=not cert_sign,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


def check(directory: Path) -> None:
    """CredentialsError unless `directory` holds the three files, each what its name says, the
    certificate signed by the CA and the key its own."""
    contents: dict[str, bytes] = {}
    for name in FILES:
        try:
            contents[name] = (directory / name).read_bytes()
        except OSError as error:
            raise CredentialsError(
                f"{directory / name}: the job's credentials cannot be read ({error.strerror or error})"
            ) from None
    try:
        ca = x509.load_pem_x509_certificate(contents[CA_FILE])
    except ValueError:
        raise CredentialsError(f"{directory / CA_FILE}: not a PEM certificate") from None
    try:
        cert = x509.load_pem_x509_certificate(contents[CERT_FILE])
    except ValueError:
        raise CredentialsError(f"{directory / CERT_FILE}: not a PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(contents[KEY_FILE], password=None)
    except (ValueError, TypeError):
        raise CredentialsError(f"{directory / KEY_FILE}: not an unencrypted PEM private key") from None
    try:
        cert.verify_directly_issued_by(ca)
    except (InvalidSignature, ValueError, TypeError) as error:
        raise CredentialsError(
            f"{directory / CERT_FILE}: not signed by the CA in {CA_FILE} ({type(error).__name__})"
        ) from None
    public = serialization.PublicFormat.SubjectPublicKeyInfo
    pem = serialization.Encoding.PEM
    if key.public_key().public_bytes(pem, public) != cert.public_key().public_bytes(pem, public):
        raise CredentialsError(f"{directory / KEY_FILE}: not the key of the certificate in {CERT_FILE}")


SESSION_TICKETS = 0
"""Session tickets a supervisor's server sends after each handshake (OpenSSL's default is 2). No
client of a job resumes a session (each connection is a new one, and a hand-over's clients connect
to a leader that never issued them a ticket), and making the two tickets was 40 % of the server's
CPU per handshake (0.82 -> 0.50 ms measured by benchmarks/tls_handshake.py): the cost of a new
leader accepting every member of a 25,000-host job."""


def server_context(directory: Path) -> ssl.SSLContext:
    """TLS 1.3 for a supervisor's server: shows the job's certificate, requires the client's, signed
    by the job's CA; issues no session ticket."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.num_tickets = SESSION_TICKETS
    return _mutual(context, directory)


def client_context(directory: Path) -> ssl.SSLContext:
    """TLS 1.3 for a supervisor reaching another: requires the server's certificate signed by the
    job's CA, shows its own (no host name check: the module's docstring says why)."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    return _mutual(context, directory)


def _mutual(context: ssl.SSLContext, directory: Path) -> ssl.SSLContext:
    check(directory)
    context.minimum_version = ssl.TLSVersion.TLSv1_3
    context.verify_mode = ssl.CERT_REQUIRED
    context.load_verify_locations(cafile=str(directory / CA_FILE))
    context.load_cert_chain(str(directory / CERT_FILE), str(directory / KEY_FILE))
    return context
