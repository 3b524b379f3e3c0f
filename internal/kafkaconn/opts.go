package kafkaconn

import (
	"strings"

	"github.com/twmb/franz-go/pkg/kgo"
)

// Opts validates c and returns the franz-go options that connect a client
// as c says: the seed brokers, TLS (kgo.DialTLSConfig) when on and SASL
// (kgo.SASL) when a mechanism is set. Give them to every kgo.NewClient
// that talks to this cluster.
func (c Config) Opts() ([]kgo.Opt, error) {
	if err := c.Validate(); err != nil {
		return nil, err
	}
	brokers := make([]string, len(c.Brokers))
	for i, b := range c.Brokers {
		brokers[i] = strings.TrimSpace(b)
	}
	opts := []kgo.Opt{kgo.SeedBrokers(brokers...)}
	tlsCfg, err := c.tlsConfig()
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		opts = append(opts, kgo.DialTLSConfig(tlsCfg))
	}
	if m := c.saslMechanism(); m != nil {
		opts = append(opts, kgo.SASL(m))
	}
	return opts, nil
}
