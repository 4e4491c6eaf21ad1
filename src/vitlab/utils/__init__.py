"""Plumbing every layer may use, importing nothing of vitlab's: `io` (atomic writes, output errors), `progress`
(one progress-bar policy), `extras` (optional dependencies and the install line that brings them), `version`."""
