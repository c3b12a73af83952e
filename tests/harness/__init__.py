"""Real servers for tests: each test run starts its own and stops it at the end."""
