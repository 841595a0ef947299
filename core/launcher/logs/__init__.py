"""Worker output: LogsSpecs (destinations) and the pump that moves the lines."""
