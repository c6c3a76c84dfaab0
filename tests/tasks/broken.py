import nonexistent_dependency_for_tests  # noqa: F401
