// Package drivers is the registry of paystream's provider drivers: the one
// place that knows every driver package, so the sources file can name a
// driver and cmd/ never imports drivers one by one.
package drivers

import (
	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/asaas"
	"github.com/paystream/paystream/internal/provider/hmac"
	"github.com/paystream/paystream/internal/provider/mercadopago"
	"github.com/paystream/paystream/internal/provider/pagarme"
	"github.com/paystream/paystream/internal/provider/pagbank"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
	"github.com/paystream/paystream/internal/provider/stripe"
	"github.com/paystream/paystream/internal/provider/zoop"
)

// registry is every driver: its name in the sources file, its constructor
// and its fixture webhooks.
var registry = []struct {
	name    string
	factory provider.Factory
	webhook provider.FixtureFunc
}{
	{"standardwebhooks", standardwebhooks.New, standardwebhooks.Webhook},
	{"stripe", stripe.New, stripe.Webhook},
	{"hmac", hmac.New, hmac.Webhook},
	{"pagarme", pagarme.New, pagarme.Webhook},
	{"asaas", asaas.New, asaas.Webhook},
	{"mercadopago", mercadopago.New, mercadopago.Webhook},
	{"pagbank", pagbank.New, pagbank.Webhook},
	{"zoop", zoop.New, zoop.Webhook},
}

// Factories returns a new map from driver name, as written in the sources
// file, to the driver's constructor.
func Factories() map[string]provider.Factory {
	m := make(map[string]provider.Factory, len(registry))
	for _, d := range registry {
		m[d.name] = d.factory
	}
	return m
}

// Fixtures returns a new map from driver name to the driver's
// provider.FixtureFunc: each gateway's webhooks as it sends them, signed,
// for tests and the tools (load generator, simulator).
func Fixtures() map[string]provider.FixtureFunc {
	m := make(map[string]provider.FixtureFunc, len(registry))
	for _, d := range registry {
		m[d.name] = d.webhook
	}
	return m
}
