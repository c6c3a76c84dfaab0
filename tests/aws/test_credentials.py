"""Where the function's connection parameters come from: URL, Secrets Manager, IAM."""

import json

import psycopg
import pytest
from freezegun import freeze_time
from psycopg.conninfo import conninfo_to_dict

from drainer import enqueue, errors
from drainer.aws.credentials import Credentials
from handlers.aws_lambda import handler
from tests.aws.helpers import REGION, FakeContext, make_secret, secrets
from tests.cluster import PASSWORD_ROLE
from tests.helpers import unavailable

RDS_SECRET = {"engine": "postgres", "username": "app", "password": "pw-1", "host": "db.internal",
              "port": 5432, "dbname": "jobs", "dbInstanceIdentifier": "db"}


def test_a_url_is_used_as_given(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://app:pw@db.internal/jobs")
    assert Credentials.from_env().conninfo() == "postgresql://app:pw@db.internal/jobs"


def test_an_rds_secret_gives_host_port_user_password_and_database(monkeypatch):
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", make_secret(RDS_SECRET))
    monkeypatch.setenv("DATABASE_URL", "postgresql://ignored@elsewhere/x")  # the secret wins
    assert conninfo_to_dict(Credentials.from_env().conninfo()) == {
        "host": "db.internal", "port": "5432", "user": "app", "password": "pw-1",
        "dbname": "jobs"}


def test_the_secret_is_cached_for_its_ttl(monkeypatch):
    arn = make_secret(RDS_SECRET)
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", arn)
    monkeypatch.setenv("DRAINER_SECRET_TTL", "300")
    with freeze_time("2026-12-02 12:00:00") as frozen:
        creds = Credentials.from_env()
        assert conninfo_to_dict(creds.conninfo())["password"] == "pw-1"
        secrets().put_secret_value(SecretId=arn, SecretString=json.dumps(
            {**RDS_SECRET, "password": "pw-2"}))
        frozen.tick(299)
        assert conninfo_to_dict(Credentials.from_env().conninfo())["password"] == "pw-1"
        frozen.tick(2)
        assert conninfo_to_dict(Credentials.from_env().conninfo())["password"] == "pw-2"


@pytest.mark.parametrize("text", ["not json", json.dumps({"username": "app"}), "[1, 2]"])
def test_a_secret_not_in_the_rds_shape_is_a_configuration_error(monkeypatch, text):
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", make_secret(text))
    with pytest.raises(errors.ConfigError, match="RDS shape"):
        Credentials.from_env().conninfo()


def token_of(conninfo: str) -> tuple[str, dict]:
    params = conninfo_to_dict(conninfo)
    return params.pop("password"), params


def test_iam_authentication_signs_a_fresh_token_per_connection_and_requires_tls(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql://iam_app@db.internal:5433/jobs")
    monkeypatch.setenv("DRAINER_DATABASE_IAM_AUTH", "1")
    creds = Credentials.from_env()
    with freeze_time("2026-12-02 12:00:00"):
        first, params = token_of(creds.conninfo())
    with freeze_time("2026-12-02 12:05:00"):
        second, _ = token_of(creds.conninfo())
    assert params == {"host": "db.internal", "port": "5433", "user": "iam_app",
                      "dbname": "jobs", "sslmode": "require"}
    assert first.startswith("db.internal:5433/?Action=connect&DBUser=iam_app&")
    assert "X-Amz-Date=20261202T120000Z" in first and "X-Amz-Expires=900" in first
    assert "X-Amz-Signature=" in first and f"%2F{REGION}%2Frds-db%2F" in first
    assert second != first and "X-Amz-Date=20261202T120500Z" in second


def test_iam_keeps_a_stronger_tls_mode_and_takes_the_host_from_a_secret(monkeypatch):
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", make_secret(RDS_SECRET))
    monkeypatch.setenv("DRAINER_DATABASE_IAM_AUTH", "true")
    monkeypatch.setenv("PGSSLMODE", "verify-full")
    token, params = token_of(Credentials.from_env().conninfo())
    assert token.startswith("db.internal:5432/?Action=connect&DBUser=app&")
    assert params["sslmode"] == "verify-full"


def test_iam_without_a_host_is_a_configuration_error(monkeypatch):
    monkeypatch.setenv("DATABASE_URL", "postgresql:///jobs")
    monkeypatch.setenv("DRAINER_DATABASE_IAM_AUTH", "1")
    with pytest.raises(errors.ConfigError, match="host and a user"):
        Credentials.from_env().conninfo()


def test_a_rotated_secret_is_read_again_when_the_server_refuses_the_cached_one(
        function_env, server, conn, monkeypatch):
    info = conninfo_to_dict(function_env)
    with server.admin() as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(f"CREATE ROLE {PASSWORD_ROLE} LOGIN PASSWORD 'pw-1'")
    conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {PASSWORD_ROLE}")
    secret = {"username": PASSWORD_ROLE, "password": "pw-1", "host": info["host"],
              "port": int(info["port"]), "dbname": info["dbname"]}
    arn = make_secret(secret)
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", arn)
    try:
        psycopg.connect(server.url(info["dbname"], PASSWORD_ROLE, "wrong")).close()
        unavailable("password", "this server does not ask for passwords over TCP")
    except psycopg.OperationalError:
        pass
    enqueue(conn, "aws", {})
    assert handler({"source": "drainer.cron"}, FakeContext(60))["done"] == 1  # pw-1, cached
    with server.admin() as admin:  # rotation: the role's password, then the secret
        admin.execute(f"ALTER ROLE {PASSWORD_ROLE} PASSWORD 'pw-2'")
    secrets().put_secret_value(SecretId=arn, SecretString=json.dumps(
        {**secret, "password": "pw-2"}))
    enqueue(conn, "aws", {})
    assert handler({"source": "drainer.cron"}, FakeContext(60))["done"] == 1
    with server.admin() as admin:  # a wrong secret is an authentication error, once
        admin.execute(f"ALTER ROLE {PASSWORD_ROLE} PASSWORD 'pw-3'")
    with pytest.raises(errors.AuthenticationFailed) as failed:
        handler({"source": "drainer.cron"}, FakeContext(60))
    assert "pw-2" not in str(failed.value) and failed.value.exit_code == 3
