"""Handing the daemon to the system's service manager: launchd on macOS, systemd on Linux."""
