#!/usr/bin/env bash
# Thin wrapper for the Makefile: deploy/stack.sh up [args]. See deploy/README.md.
exec "$(dirname "${BASH_SOURCE[0]}")/stack.sh" up "$@"
