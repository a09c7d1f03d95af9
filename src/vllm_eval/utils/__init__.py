"""What every layer uses: the package's errors, lazy exports and moved-module paths, logging, progress, the run's
timeline and telemetry, hub access (offline mode) and a model's metadata read from its files."""
