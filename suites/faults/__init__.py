"""One suite per fault kind: its effect and its heal on a real cluster
(README.md beside this file)."""
