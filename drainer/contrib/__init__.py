"""Integrations with frameworks, each imported only by the programs that use it."""
