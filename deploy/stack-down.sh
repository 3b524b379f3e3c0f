#!/usr/bin/env bash
# Thin wrapper for the Makefile: deploy/stack.sh down [args]. See deploy/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/stack.sh" down "$@"
