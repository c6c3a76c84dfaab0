"""The test suite's throwaway PostgreSQL clusters: drainer.embedded.Cluster (the one
implementation, which drainer.testing starts for users' test sessions too), set up
as the suite, the soak, the benchmarks and CI want it.

On top of the library's defaults it preloads pg_stat_statements (the footprint tests
and the benchmarks count statements) and asks a password over TCP of the role
PASSWORD_ROLE, so tests can exercise authentication failures. As root the server
runs as an unprivileged user (drainer.embedded.server_user).
"""

from pathlib import Path

from drainer import embedded
from drainer.embedded import embedded_bin_dir, free_port, server_user

__all__ = ["HBA", "PASSWORD_ROLE", "Cluster", "embedded_bin_dir", "free_port", "server_user"]

PASSWORD_ROLE = "drainer_pw"  # the one role that must give a password over TCP

HBA = f"""\
local all all trust
host all {PASSWORD_ROLE} 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
"""


class Cluster(embedded.Cluster):
    """A throwaway cluster as the suite wants it; `stop()` removes it."""

    def __init__(self, bin_dir: Path | str | None = None, *,
                 settings: dict[str, str] | None = None):
        super().__init__(bin_dir, hba=HBA, settings={
            "shared_preload_libraries": "'pg_stat_statements'", **(settings or {})})
