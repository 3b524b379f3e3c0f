package simulate

import (
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/paystream/paystream/internal/provider/gatewaytest"
	"github.com/paystream/paystream/internal/provider/zoop"
	"github.com/paystream/paystream/internal/source"
)

// gatewayAPI is the fake gateway API the refetching sources read, on one
// address: the generic one (gatewaytest.Gateway: paystream's refetch
// convention and Mercado Pago's payments) and a fake Zoop API
// (gatewaytest.Zoop) per marketplace of the zoop sources. With zoop sources
// each fake listens on a loopback port of its own and a reverse proxy on
// the address routes /v1/marketplaces/{id}/… to that marketplace's Zoop
// and every other path to the generic one; without, the generic one serves
// the address itself.
type gatewayAPI struct {
	url     string
	generic *gatewaytest.Gateway         // nil when no source reads it
	zoop    map[string]*gatewaytest.Zoop // by marketplace id
	front   *http.Server                 // nil without zoop sources
}

// gatewayNeeds is what the refetching sources need served: the generic
// API's token, and each Zoop marketplace's API key.
type gatewayNeeds struct {
	token     string
	zoopKeys  map[string]string // marketplace → API key
	scopes    map[string]string // source → marketplace, for zoop sources
	refetches bool
}

// needs reads what the refetching sources among refetch need from the
// fake gateway API. Every source reading the generic API must use one
// api_token (it serves one); two zoop sources of one marketplace, one API
// key.
func needs(built map[string]*source.Source, refetch map[string]bool) (gatewayNeeds, error) {
	n := gatewayNeeds{zoopKeys: map[string]string{}, scopes: map[string]string{}}
	for name, on := range refetch {
		if !on {
			continue
		}
		src := built[name]
		if profiles[src.DriverName].gateway == nil {
			return n, fmt.Errorf("source %s refetches, but the simulator has no gateway API for driver %s", name, src.DriverName)
		}
		n.refetches = true
		rc := src.Refetch
		if d, ok := src.Driver.(*zoop.Driver); ok {
			mp := d.Marketplace()
			if k, seen := n.zoopKeys[mp]; seen && k != rc.Token {
				return n, fmt.Errorf("zoop sources of marketplace %s have different api_token values: the fake Zoop API serves one", mp)
			}
			n.zoopKeys[mp] = rc.Token
			n.scopes[name] = mp
			continue
		}
		if n.token != "" && rc.Token != n.token {
			return n, errors.New("the refetching sources have different api_token values: the fake gateway API serves one")
		}
		n.token = rc.Token
	}
	return n, nil
}

// serveGateway serves what n needs on ln. It closes ln on error.
func serveGateway(ln net.Listener, n gatewayNeeds) (*gatewayAPI, error) {
	if len(n.zoopKeys) == 0 {
		gw, err := gatewaytest.Serve(ln, n.token)
		if err != nil {
			ln.Close()
			return nil, err
		}
		return &gatewayAPI{url: gw.URL(), generic: gw}, nil
	}
	g := &gatewayAPI{url: "http://" + ln.Addr().String(), zoop: map[string]*gatewaytest.Zoop{}}
	fail := func(err error) (*gatewayAPI, error) {
		ln.Close()
		g.close()
		return nil, err
	}
	mux := http.NewServeMux()
	if n.token != "" {
		back, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		if g.generic, err = gatewaytest.Serve(back, n.token); err != nil {
			back.Close()
			return fail(err)
		}
		p, err := proxyTo(g.generic.URL())
		if err != nil {
			return fail(err)
		}
		mux.Handle("/", p)
	}
	for mp, key := range n.zoopKeys {
		back, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return fail(err)
		}
		z, err := gatewaytest.ServeZoop(back, key, mp)
		if err != nil {
			back.Close()
			return fail(err)
		}
		g.zoop[mp] = z
		p, err := proxyTo(z.URL())
		if err != nil {
			return fail(err)
		}
		// Another marketplace's paths fall through to "/": the generic
		// API's 404, or the mux's.
		mux.Handle("/v1/marketplaces/"+mp+"/", p)
	}
	g.front = &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = g.front.Serve(ln) }()
	return g, nil
}

// proxyTo is a reverse proxy to a fake API's base URL.
func proxyTo(raw string) (*httputil.ReverseProxy, error) {
	u, err := url.Parse(raw)
	if err != nil {
		return nil, fmt.Errorf("fake gateway API url: %w", err)
	}
	p := httputil.NewSingleHostReverseProxy(u)
	p.ErrorHandler = func(w http.ResponseWriter, _ *http.Request, _ error) { w.WriteHeader(http.StatusBadGateway) }
	return p, nil
}

// set makes the API answer body for payment id of a source of driver, in
// marketplace scope (zoop).
func (g *gatewayAPI) set(driver, scope, id string, body []byte) error {
	if driver == "zoop" {
		z := g.zoop[scope]
		if z == nil {
			return fmt.Errorf("fake gateway API: no Zoop API for marketplace %s", scope)
		}
		z.SetTransaction(id, body)
		return nil
	}
	if g.generic == nil {
		return errors.New("fake gateway API: no generic API")
	}
	g.generic.SetPayment(id, body)
	return nil
}

// close stops the front (closing the address's listener) and every fake.
func (g *gatewayAPI) close() {
	if g.front != nil {
		_ = g.front.Close()
	}
	if g.generic != nil {
		g.generic.Close()
	}
	for _, z := range g.zoop {
		z.Close()
	}
}

// marketplaces lists the Zoop marketplaces served, for logs.
func (g *gatewayAPI) marketplaces() string {
	return strings.Join(slices.Sorted(maps.Keys(g.zoop)), ",")
}
