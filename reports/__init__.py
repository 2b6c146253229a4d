"""Run store and rendering: where a run's evidence is kept and told."""
