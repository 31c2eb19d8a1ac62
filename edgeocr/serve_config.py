"""The daemon's settings, importable without the HTTP stack (`edgeocr serve --help`, deploy checks)."""

from edgeocr.serve.config import (HELP, ConfigError, ServerConfig, add_arguments, read_config_file,  # noqa: F401
                                  resolve, validate)
