// Package kafkaconn is how every paystream command connects to Kafka
// securely: one [Config] (seed brokers, TLS, SASL) that cmd/paystream
// fills from its --kafka-* flags and PAYSTREAM_KAFKA_* variables,
// [Config.Validate] naming the bad setting in one line, [Config.Opts]
// turning it into franz-go options (kgo.DialTLSConfig and kgo.SASL with
// franz-go's own pkg/sasl mechanisms), and [Config.Check], which connects
// once at start so that a wrong password or certificate stops a command
// with one clear line ([Config.Explain]) instead of retrying forever.
//
// Secrets (the SASL password, the OAuth token, AWS keys) are read from
// files or the environment, the files again at each authentication so a
// rotated secret is picked up without a restart, and never printed:
// [Config.String] and [Config.LogValue] redact them.
package kafkaconn
