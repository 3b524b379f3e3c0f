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

// Factories returns a new map from driver name, as written in the sources
// file, to the driver's constructor.
func Factories() map[string]provider.Factory {
	return map[string]provider.Factory{
		"standardwebhooks": standardwebhooks.New,
		"stripe":           stripe.New,
		"hmac":             hmac.New,
		"pagarme":          pagarme.New,
		"asaas":            asaas.New,
		"mercadopago":      mercadopago.New,
		"pagbank":          pagbank.New,
		"zoop":             zoop.New,
	}
}

// Fixtures returns a new map from driver name to the driver's
// provider.FixtureFunc: each gateway's webhooks as it sends them, signed,
// for tests and the tools (load generator, simulator).
func Fixtures() map[string]provider.FixtureFunc {
	return map[string]provider.FixtureFunc{
		"standardwebhooks": standardwebhooks.Webhook,
		"stripe":           stripe.Webhook,
		"hmac":             hmac.Webhook,
		"pagarme":          pagarme.Webhook,
		"asaas":            asaas.Webhook,
		"mercadopago":      mercadopago.Webhook,
		"pagbank":          pagbank.Webhook,
		"zoop":             zoop.Webhook,
	}
}
