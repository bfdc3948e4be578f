"""The test suite, a package so that its support modules import as ``tests.support`` without ``sys.path`` edits."""
