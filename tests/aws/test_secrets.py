"""The Lambda function shows no password from a Secrets Manager secret and no RDS
IAM token: not in its JSON log lines, its result, nor the error it raises."""

import json

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from drainer import enqueue, errors
from drainer.aws import clients
from handlers.aws_lambda import handler
from tests.aws.helpers import FakeContext, make_secret
from tests.cluster import PASSWORD_ROLE

SECRET = "Pw-secret-5e1f:@/%"


def shown(capsys, *more: object) -> str:
    out = capsys.readouterr()
    return out.out + out.err + "".join(map(str, more))


def test_a_secret_password_shows_nowhere_used_or_refused(function_env, server, conn,
                                                        monkeypatch, capsys):
    info = conninfo_to_dict(function_env)
    with server.admin() as admin:
        admin.execute(f"DROP ROLE IF EXISTS {PASSWORD_ROLE}")
        admin.execute(psycopg.sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
            psycopg.sql.Identifier(PASSWORD_ROLE), SECRET))
    conn.execute(f"GRANT ALL ON ALL TABLES IN SCHEMA public TO {PASSWORD_ROLE}")
    monkeypatch.delenv("DATABASE_URL")
    monkeypatch.setenv("DRAINER_DATABASE_SECRET_ARN", make_secret(
        {"username": PASSWORD_ROLE, "password": SECRET, "host": info["host"],
         "port": int(info["port"]), "dbname": info["dbname"]}))
    enqueue(conn, "aws", {"fail": "planned"}, max_attempts=1)
    result = handler({"source": "drainer.cron"}, FakeContext(60))
    assert result["failed"] == 1
    assert SECRET not in shown(capsys, json.dumps(result))

    with server.admin() as admin:  # the secret is now wrong: refused, with logs
        admin.execute(f"ALTER ROLE {PASSWORD_ROLE} PASSWORD 'another-one'")
    with pytest.raises(errors.AuthenticationFailed) as refused:
        handler({"source": "drainer.cron"}, FakeContext(60))
    text = shown(capsys, refused.value)
    assert "authentication failed" in text and SECRET not in text
    conn.execute(f"DROP OWNED BY {PASSWORD_ROLE}")  # its grants here, so the role can go
    with server.admin() as admin:
        admin.execute(f"DROP ROLE {PASSWORD_ROLE}")


def test_an_iam_token_shows_nowhere_when_the_connection_fails(function_env, monkeypatch,
                                                              capsys):
    """The test server has no TLS, so the connection an IAM token requires fails."""
    info = conninfo_to_dict(function_env)
    monkeypatch.setenv("DATABASE_URL", f"postgresql://iam_app@{info['host']}:{info['port']}/"
                                       f"{info['dbname']}")
    monkeypatch.setenv("DRAINER_DATABASE_IAM_AUTH", "1")
    tokens = []
    rds = clients.get("rds")
    sign = rds.generate_db_auth_token

    def recorded(**kw: object) -> str:
        tokens.append(sign(**kw))
        return tokens[-1]

    monkeypatch.setattr(rds, "generate_db_auth_token", recorded)
    with pytest.raises(errors.DrainerError) as failed:
        handler({"source": "drainer.cron"}, FakeContext(60))
    text = shown(capsys, failed.value)
    assert tokens and "X-Amz-Signature=" in tokens[0]
    for token in tokens:
        signature = token.split("X-Amz-Signature=")[1]
        assert token not in text and signature not in text
