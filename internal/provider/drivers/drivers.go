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
