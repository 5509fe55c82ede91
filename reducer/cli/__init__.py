"""Command-line interface: argument parsing only; the logic lives in the library."""
