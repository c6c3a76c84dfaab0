"""A task module that fails to import with the database URL in its message."""

import os

raise RuntimeError(f"this module cannot use {os.environ.get('DATABASE_URL')}")
