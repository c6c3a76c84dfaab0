"""The database URL from Secret Manager: read through the official client, cached,
read again when the server refuses it (rotated), and shown nowhere."""

import json

import grpc
import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from drainer import enqueue
from drainer.errors import ConfigError
from drainer.gcp.credentials import version_of
from tests.cluster import PASSWORD_ROLE
from tests.gcp.conftest import PROJECT

CRON = json.dumps({"source": "drainer.cron"})
SECRET = f"projects/{PROJECT}/secrets/drainer-db"
LATEST = f"{SECRET}/versions/latest"
PASSWORDS = ("Pw-gcp-5e1f:@/%", "Pw-gcp-rotated-77")


@pytest.fixture
def password_db(function_env, server, conn, monkeypatch):
    """The function's database, reached as PASSWORD_ROLE, named by a secret only."""
    with server.admin() as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            psycopg.sql.Identifier(PASSWORD_ROLE), PASSWORDS[0]))
    conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {PASSWORD_ROLE}")
    conn.execute(f"GRANT ALL ON ALL SEQUENCES IN SCHEMA public TO {PASSWORD_ROLE}")
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("DRAINER_DATABASE_SECRET", SECRET)
    yield conninfo_to_dict(function_env)
    conn.execute(f"DROP OWNED BY {PASSWORD_ROLE}")  # its grants here, so the role can go
    with server.admin() as admin:
        admin.execute(f"DROP ROLE {PASSWORD_ROLE}")


def url(info: dict, password: str) -> bytes:
    return make_conninfo(host=info["host"], port=info["port"], dbname=info["dbname"],
                         user=PASSWORD_ROLE, password=password).encode()


def reads(cloud) -> int:
    return sum(method == "AccessSecretVersion" for method, _ in cloud.secrets.calls)


def test_the_secret_is_read_once_then_again_when_the_server_refuses_it(
        password_db, server, conn, http, cloud, capsys):
    cloud.secrets.versions[LATEST] = url(password_db, PASSWORDS[0])
    for _ in range(2):
        enqueue(conn, "gcp", {})
        assert http.post("/", data=CRON).get_json()["done"] == 1
    assert reads(cloud) == 1  # cached for DRAINER_SECRET_TTL
    with server.admin() as admin:  # rotated: the server and the secret
        admin.execute(f"ALTER ROLE {PASSWORD_ROLE} PASSWORD '{PASSWORDS[1]}'")
    cloud.secrets.versions[LATEST] = url(password_db, PASSWORDS[1])
    enqueue(conn, "gcp", {"fail": "planned"}, max_attempts=1)
    response = http.post("/", data=CRON)
    assert (response.status_code, response.get_json()["failed"]) == (200, 1)
    assert reads(cloud) == 2
    with server.admin() as admin:  # wrong everywhere now: refused, and said so
        admin.execute(f"ALTER ROLE {PASSWORD_ROLE} PASSWORD 'another-one'")
    refused = http.post("/", data=CRON)
    assert refused.status_code == 500
    assert refused.get_json()["exit_code"] == 3
    shown = capsys.readouterr().out + response.get_data(as_text=True) + refused.get_data(
        as_text=True)
    assert "authentication failed" in shown
    assert not [p for p in PASSWORDS if p in shown]


@pytest.mark.parametrize(("code", "words"), [
    (None, "does not exist"),
    (grpc.StatusCode.PERMISSION_DENIED, "roles/secretmanager.secretAccessor"),
])
def test_a_secret_that_cannot_be_read_is_a_clear_configuration_error(
        password_db, conn, http, cloud, code, words):
    if code is not None:
        cloud.secrets.versions[LATEST] = b"postgresql://"
        cloud.secrets.refuse["AccessSecretVersion"] = code
    enqueue(conn, "gcp", {})
    response = http.post("/", data=CRON)
    assert (response.status_code, response.get_json()["exit_code"]) == (500, 2)
    assert words in response.get_json()["error"]


@pytest.mark.parametrize(("given", "read"), [
    (SECRET, LATEST),
    (f"{SECRET}/versions/3", f"{SECRET}/versions/3"),
])
def test_a_secret_names_its_latest_version_unless_it_names_one(given, read):
    assert version_of(given) == read


@pytest.mark.parametrize("given", ["drainer-db", "projects/p/secrets", "projects/p/keys/k",
                                   "projects//secrets/s"])
def test_a_secret_name_of_another_shape_is_refused(given):
    with pytest.raises(ConfigError, match="DRAINER_DATABASE_SECRET"):
        version_of(given)
