"""The Redis tier against a real redis-server that asks for a login and speaks TLS.

One redis-server listens on a plain port and a TLS port (certificates made here with openssl: a
CA and a server certificate for 127.0.0.1), its `default` user off and one ACL user, `alice`, on.
A second redis-server has only `requirepass` (the `default` user's password). The models:

  tls_alice        rediss:, alice's login from a file, the CA file: exact rows over TLS
  plain_alice      redis:, alice's login from the server's environment
  requirepass      redis:, a bare password (the default user) from a file
  wrong_password   alice with a wrong password: the load fails, naming the user and the file
  wrong_ca         rediss: with a CA that did not sign the server's certificate: the load fails

The password never appears in the server's log.
"""

from __future__ import annotations

import os
import subprocess

import numpy as np
import pytest

from conftest import module_server
from embedding_helpers import Redis, embedding_config, hps_io, redis_lookup
from tritonserver_harness import ModelRepo, free_ports, make_client

DIM, DEFAULT, ROWS = 4, -3.0, 50
PASSWORD = "s3cret-Pass:with-colon"
REQUIREPASS = "just-a-password"


def openssl(*args, cwd):
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_certs(d: str) -> dict:
    """A CA, a server certificate it signs for 127.0.0.1/localhost, and an unrelated CA."""
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.crt",
            "-days", "2", "-subj", "/CN=test-ca", cwd=d)
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "other.key", "-out", "other.crt",
            "-days", "2", "-subj", "/CN=other-ca", cwd=d)
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "server.key", "-out", "server.csr",
            "-subj", "/CN=127.0.0.1", cwd=d)
    with open(os.path.join(d, "san.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\n"
                "keyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", "server.crt", "-days", "2", "-extfile", "san.ext", cwd=d)
    return {k: os.path.join(d, f"{k}.crt") for k in ("ca", "other", "server")} | {"key": os.path.join(d, "server.key")}


class AuthRedis(Redis):
    """A Redis whose plain-port writer logs in first (AUTH user password)."""

    def __init__(self, port, workdir, extra_args, login):
        super().__init__(port, workdir, extra_args)
        self.login = login

    def pipeline(self, commands) -> None:
        super().pipeline([[b"AUTH", *self.login], *commands])


@pytest.fixture(scope="module")
def redises(tmp_path_factory):
    d = str(tmp_path_factory.mktemp("redis-tls"))
    certs = make_certs(d)
    acl_port, tls_port, pass_port = free_ports(3)
    acl = AuthRedis(acl_port, d, [
        "--tls-port", str(tls_port), "--tls-cert-file", certs["server"], "--tls-key-file", certs["key"],
        "--tls-ca-cert-file", certs["ca"], "--tls-auth-clients", "no",
        "--user", "default", "off",
        "--user", "alice", "on", f">{PASSWORD}", "~*", "+@all"], [b"alice", PASSWORD.encode()]).start()
    d2 = str(tmp_path_factory.mktemp("redis-pass"))
    plain = AuthRedis(pass_port, d2, ["--requirepass", REQUIREPASS], [REQUIREPASS.encode()]).start()
    yield {"acl": acl, "tls_port": tls_port, "plain": plain, "certs": certs, "dir": d}
    acl.stop()
    plain.stop()


@pytest.fixture(scope="module")
def repo(tmp_path_factory, redises):
    r = ModelRepo(str(tmp_path_factory.mktemp("redis-auth-repo")))
    secrets = str(tmp_path_factory.mktemp("secrets"))

    def secret(name, text):
        path = os.path.join(secrets, name)
        with open(path, "w") as f:
            f.write(text + "\n")
        return path

    alice = secret("alice", f"alice:{PASSWORD}")
    tls = f"rediss:127.0.0.1:{redises['tls_port']}"
    plain = f"redis:127.0.0.1:{redises['acl'].port}"
    models = {
        "tls_alice": dict(volatile_db=tls, volatile_db_credential_file=alice,
                          volatile_db_tls_ca_file=redises["certs"]["ca"]),
        "plain_alice": dict(volatile_db=plain, volatile_db_credential_env="TEST_REDIS_LOGIN"),
        "requirepass": dict(volatile_db=f"redis:127.0.0.1:{redises['plain'].port}",
                            volatile_db_credential_file=secret("bare", REQUIREPASS)),
        "wrong_password": dict(volatile_db=tls, volatile_db_credential_file=secret("wrong", "alice:not-it"),
                               volatile_db_tls_ca_file=redises["certs"]["ca"]),
        "wrong_ca": dict(volatile_db=tls, volatile_db_credential_file=alice,
                         volatile_db_tls_ca_file=redises["certs"]["other"]),
    }
    for name, params in models.items():
        os.makedirs(os.path.join(r.root, name, "1"))
        r.write_config(name, embedding_config(
            name, hps_io(), embedding_table_names="r", embedding_vecsize_per_table=DIM,
            default_value_for_each_table=DEFAULT, sparse_files="none", gpucacheper="0", **params))
    return r


@pytest.fixture(scope="module")
def server(request, tmp_path_factory, repo):
    return module_server(request, tmp_path_factory, repo, "--model-control-mode=explicit",
                         env={"TEST_REDIS_LOGIN": f"alice:{PASSWORD}"})


def test_a_login_over_tls_and_plain_gets_exact_rows(server, redises):
    rng = np.random.default_rng(7)
    rows = rng.standard_normal((ROWS, DIM)).astype(np.float32)
    for r in (redises["acl"], redises["plain"]):
        r.set_rows("r", range(ROWS), rows)
    keys = np.array([3, 0, 49, 17, ROWS + 1], dtype=np.int64)  # the last one Redis lacks
    want = np.vstack([rows[keys[:-1]], np.full((1, DIM), DEFAULT, np.float32)])
    client = make_client(server, "http")
    for model in ("tls_alice", "plain_alice", "requirepass"):
        r = server.load(model)
        assert r.status_code == 200, f"{model}: {r.text}"
        got = redis_lookup(client, model, keys, DIM)
        assert np.array_equal(got, want), f"{model}: {got} != {want}"
        print(f"\n[redis auth] {model}: {len(keys)} rows exact")


@pytest.mark.parametrize("model,words", [
    ("wrong_password", ["Redis refused the login", "user 'alice'", "file '", "wrong"]),
    ("wrong_ca", ["certificate", "CA file '", "other.crt"]),
])
def test_a_refused_login_or_certificate_fails_the_load_clearly(server, model, words):
    r = server.load(model)
    msg = r.json().get("error", r.text)
    print(f"\n[redis auth] {model}: {r.status_code} {msg}")
    assert r.status_code == 400, msg
    for w in words:
        assert w in msg, (w, msg)
    assert not server.model_ready(model)


def test_the_password_is_never_logged(server):
    log = server.log_text()
    assert "alice" in log, "the log should name the user"
    for secret in (PASSWORD, REQUIREPASS, "not-it"):
        assert secret not in log, f"{secret!r} appears in the server's log"
