// Package e2e holds paystream's end-to-end tests: ingest, processor and sink
// wired together on a real Kafka broker and a real Postgres, and the
// processor run as a subprocess so tests can SIGKILL it mid-stream.
package e2e
