package chaos

import (
	"context"
	"fmt"
	"net"
	"strings"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// proxy is a toxiproxy TCP proxy embedded in the harness: no toxiproxy
// server process, no HTTP API, the toxics are added and removed in
// process. One proxy forwards one upstream address.
type proxy struct {
	p *toxiproxy.Proxy
}

// newProxy starts a proxy on a free loopback port forwarding to upstream
// (host:port).
func newProxy(name, upstream string) (*proxy, error) {
	server := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	p := toxiproxy.NewProxy(server, name, "127.0.0.1:0", upstream)
	if err := p.Start(); err != nil {
		return nil, fmt.Errorf("start proxy %s to %s: %w", name, upstream, err)
	}
	return &proxy{p: p}, nil
}

// addr is the proxy's listen address.
func (x *proxy) addr() string { return x.p.Listen }

// close stops the proxy and closes every connection through it.
func (x *proxy) close() { x.p.Stop() }

// Toxics the scenarios use. Each is added to both directions' chains where
// it matters, under a fixed name so clear can remove it.
const (
	// toxicReset closes every connection that carries data with an RST
	// (SO_LINGER 0), at once: connection resets.
	toxicReset = `{"name":"reset","type":"reset_peer","stream":"upstream","attributes":{"timeout":0}}`
	// toxicBlackhole drops every byte and never answers; removing it closes
	// the connections it held (toxiproxy's timeout toxic cleans up by
	// closing), as the peers' keepalives would end them after a real
	// partition.
	toxicBlackholeUp   = `{"name":"blackhole_up","type":"timeout","stream":"upstream","attributes":{"timeout":0}}`
	toxicBlackholeDown = `{"name":"blackhole_down","type":"timeout","stream":"downstream","attributes":{"timeout":0}}`
)

// toxicLatency delays every chunk in both directions by ms ± jitter.
func toxicLatency(ms, jitter int) []string {
	return []string{
		fmt.Sprintf(`{"name":"latency_up","type":"latency","stream":"upstream","attributes":{"latency":%d,"jitter":%d}}`, ms, jitter),
		fmt.Sprintf(`{"name":"latency_down","type":"latency","stream":"downstream","attributes":{"latency":%d,"jitter":%d}}`, ms, jitter),
	}
}

// add adds toxics (toxiproxy's JSON form).
func (x *proxy) add(toxics ...string) error {
	for _, t := range toxics {
		if _, err := x.p.Toxics.AddToxicJson(strings.NewReader(t)); err != nil {
			return fmt.Errorf("proxy %s: add toxic: %w", x.p.Name, err)
		}
	}
	return nil
}

// clear removes every toxic: traffic flows normally again.
func (x *proxy) clear() { x.p.Toxics.ResetToxics(context.Background()) }

// kafkaDialer returns a franz-go dial function sending every broker
// connection to the proxy. A Kafka client dials the seed brokers first and
// then the addresses the broker advertises in its metadata, which are its
// own, not the proxy's; pointing the seed at the proxy would only proxy
// the first connection. Overriding the dial itself (kgo.Dialer) proxies
// them all, without a broker listener that advertises the proxy's port.
// It needs one proxy per broker: the harness runs against one.
func (x *proxy) kafkaDialer() func(ctx context.Context, network, host string) (net.Conn, error) {
	var d net.Dialer
	return func(ctx context.Context, network, _ string) (net.Conn, error) {
		return d.DialContext(ctx, network, x.addr())
	}
}
