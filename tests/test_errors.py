"""Driver errors become a short hierarchy whose messages say what to do, without passwords."""

import psycopg
import pytest

from drainer import errors
from drainer.cluster import PASSWORD_ROLE, free_port
from drainer.db import connect

SECRET = "s3cr3t-Pa55"


def test_wrong_port_is_database_unavailable():
    with pytest.raises(errors.DatabaseUnavailable) as info:
        connect(f"postgresql://app:{SECRET}@127.0.0.1:{free_port()}/db", connect_timeout=2)
    assert "server is running" in str(info.value)
    assert SECRET not in str(info.value)
    assert info.value.exit_code == 3


def test_wrong_password_is_authentication_failed(server, db_url):
    with server.admin() as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD 'right-{SECRET}'")
    dbname = psycopg.conninfo.conninfo_to_dict(db_url)["dbname"]
    url = server.url(dbname, PASSWORD_ROLE, SECRET)
    try:
        connect(url).close()
    except errors.AuthenticationFailed as exc:
        assert "password" in str(exc) and SECRET not in str(exc)
        assert exc.exit_code == 3
    else:
        pytest.skip("this server does not ask for passwords over TCP")


def test_missing_table_is_schema_missing(empty_db_url):
    with connect(empty_db_url) as conn, pytest.raises(errors.SchemaMissing) as info:
        from drainer import queue
        queue.claim(conn, ["default"], 1, __import__("datetime").timedelta(seconds=1))
    assert "drainer migrate" in str(info.value)


def test_malformed_url_is_a_config_error():
    with pytest.raises(errors.ConfigError):
        connect("postgresql://u:p@host:notaport/db=x?bogus_option=1")


@pytest.mark.parametrize("text", [
    f"postgresql://user:{SECRET}@host/db",
    f"host=x password={SECRET} user=y",
    f"host=x password='{SECRET}' user=y",
])
def test_redact_masks_passwords(text):
    assert SECRET not in errors.redact(f"could not connect with {text}")


def test_redact_masks_a_known_password_anywhere():
    password = errors.password_of(f"postgresql://user:{SECRET}@host/db")
    assert password == SECRET
    assert errors.redact(f"role said {SECRET}!", password) == "role said ***!"
