"""Cloud entry points: each reads its configuration from the environment and makes
one call into `drainer`."""
