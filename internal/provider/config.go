package provider

import (
	"errors"
	"fmt"
	"hash"
	"time"
)

// What drivers' constructors share: the tolerance default and the checks of
// every configured secret, with the same errors naming the bad field.

// ToleranceOr returns cfg.Tolerance, or def when it is zero. A negative
// tolerance is an error naming driver.
func (cfg Config) ToleranceOr(driver string, def time.Duration) (time.Duration, error) {
	switch {
	case cfg.Tolerance < 0:
		return 0, errors.New(driver + ": Tolerance: must not be negative")
	case cfg.Tolerance == 0:
		return def, nil
	}
	return cfg.Tolerance, nil
}

// EachSecret calls add with each of cfg.Secrets and its index, after
// checking that there is at least one (what names the kind of secret in the
// error) and that none is empty. add's error is returned as
// "{driver}: Secrets[i]: {error}"; it must never include the secret.
func (cfg Config) EachSecret(driver, what string, add func(i int, secret string) error) error {
	if len(cfg.Secrets) == 0 {
		return fmt.Errorf("%s: Secrets: at least one %s is required", driver, what)
	}
	for i, s := range cfg.Secrets {
		if s == "" {
			return fmt.Errorf("%s: Secrets[%d]: empty", driver, i)
		}
		if err := add(i, s); err != nil {
			return fmt.Errorf("%s: Secrets[%d]: %w", driver, i, err)
		}
	}
	return nil
}

// Keys returns key(secret) for each of cfg.Secrets, with EachSecret's
// checks and errors; key vets the secret and makes what the driver keeps.
func Keys[K any](cfg Config, driver, what string, key func(secret string) (K, error)) ([]K, error) {
	out := make([]K, 0, len(cfg.Secrets))
	err := cfg.EachSecret(driver, what, func(_ int, s string) error {
		k, err := key(s)
		out = append(out, k)
		return err
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// HMACKey returns a Keys function making an HMAC Key of hash h from each
// secret as is.
func HMACKey(h func() hash.Hash) func(secret string) (*Key, error) {
	return func(s string) (*Key, error) { return NewKey(h, []byte(s)), nil }
}

// Signing is what a driver of a timestamped signature header (Stripe,
// Mercado Pago) keeps from its Config: a Key for each secret, the
// tolerance around the signed timestamp and the account.
type Signing struct {
	Keys      []*Key
	Tolerance time.Duration
	Account   string
}

// NewSigning reads cfg for driver: the tolerance (ToleranceOr with def),
// then the keys (Keys with what and key), with their errors.
func NewSigning(cfg Config, driver, what string, def time.Duration, key func(secret string) (*Key, error)) (Signing, error) {
	tolerance, err := cfg.ToleranceOr(driver, def)
	if err != nil {
		return Signing{}, err
	}
	keys, err := Keys(cfg, driver, what, key)
	if err != nil {
		return Signing{}, err
	}
	return Signing{Keys: keys, Tolerance: tolerance, Account: cfg.Account}, nil
}
