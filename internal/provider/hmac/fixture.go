package hmac

import (
	"fmt"
	"time"

	"github.com/paystream/paystream/internal/provider"
	"github.com/paystream/paystream/internal/provider/standardwebhooks"
)

// Webhook is f as a sender of paystream's payload convention signs it for
// this driver: the convention's body, signed with the first secret of cfg
// as cfg's options say (header, algorithm, prefix, encoding), and
// f.EventID in the id header when one is configured.
func Webhook(cfg provider.Config, f provider.Fixture, _ time.Time) (*provider.Webhook, error) {
	o := cfg.Options
	secret, err := provider.FirstSecret("hmac", cfg)
	if err != nil {
		return nil, err
	}
	if o[OptionHeader] == "" {
		return nil, fmt.Errorf("hmac: option %q is required", OptionHeader)
	}
	body, err := standardwebhooks.ConventionBody(f)
	if err != nil {
		return nil, err
	}
	sig, err := Sign(secret, o[OptionAlgorithm], o[OptionPrefix], o[OptionEncoding], body)
	if err != nil {
		return nil, err
	}
	w := provider.NewWebhook(body)
	w.Header.Set(o[OptionHeader], sig)
	if idh := o[OptionIDHeader]; idh != "" {
		w.Header.Set(idh, f.EventID)
	}
	return w, nil
}
