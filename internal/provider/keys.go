package provider

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/paystream/paystream/internal/payment"
)

// MaxIDLen is the longest event or payment id a driver accepts. Gateways'
// ids are a few dozen bytes; a longer one is a malformed payload.
const MaxIDLen = 255

// PaymentKey returns the key that identifies one payment across sources and
// accounts: "source:paymentID", or "source:account:paymentID" when account is
// set. It is the Kafka record key and the payments table's key.
func PaymentKey(source, account, paymentID string) string {
	if account == "" {
		return source + ":" + paymentID
	}
	return source + ":" + account + ":" + paymentID
}

// ScopeKey prefixes a dedup key with "account:" when account is set, so two
// accounts of one gateway that reuse event ids do not collide.
func ScopeKey(account, key string) string {
	if account == "" {
		return key
	}
	return account + ":" + key
}

// BusinessKey derives a dedup key for gateways that send no event id: a hash
// of the payment id, the gateway's event type, the normalized status and when
// the gateway says the fact happened. Two deliveries of the same event give
// the same key; two distinct events differ in at least one of these.
//
// extra distinguishes events those four fields cannot, such as two partial
// refunds of one payment within the same second (their refund ids, or the
// cumulative refunded amount).
//
// The fields are length-prefixed before hashing, so no choice of ids can make
// two different tuples collide by shifting a separator.
func BusinessKey(paymentID, eventType string, status payment.Status, occurredAt time.Time, extra ...string) string {
	h := sha256.New()
	fields := append([]string{paymentID, eventType, string(status), occurredAt.UTC().Format(time.RFC3339Nano)}, extra...)
	for _, f := range fields {
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return "bk_" + hex.EncodeToString(h.Sum(nil))[:40]
}

// EventKey is the dedup key of ev, from a gateway that may leave out its
// event ids: ev.EventID when there is one (checked; idField names it in
// the error), else ev's BusinessKey, which then needs ev.Fact.OccurredAt
// (from the field timeField).
func EventKey(ev Event, idField, timeField string) (string, error) {
	if ev.EventID != "" {
		if err := CheckID(idField, ev.EventID); err != nil {
			return "", err
		}
		return ev.EventID, nil
	}
	if ev.Fact.OccurredAt.IsZero() {
		return "", Unprocessable("neither " + idField + " nor " + timeField)
	}
	return BusinessKey(ev.PaymentID, ev.Type, ev.Fact.Status, ev.Fact.OccurredAt), nil
}

// CheckID reports whether id is usable as an event or payment id: non-empty,
// at most MaxIDLen bytes, valid UTF-8 and free of control characters (a NUL
// cannot be stored in a Postgres text column, and a newline has no business
// in a key). what names the field in the error.
func CheckID(what, id string) error {
	switch {
	case id == "":
		return Unprocessable("missing " + what)
	case len(id) > MaxIDLen:
		return Unprocessable(what + " too long")
	case !utf8.ValidString(id):
		return Unprocessable(what + " not valid UTF-8")
	case strings.IndexFunc(id, unicode.IsControl) >= 0:
		return Unprocessable(what + " contains control characters")
	}
	return nil
}

// LookupStatus returns the status statuses maps a gateway's event kind to
// (its type, event or charge status: what names it in the errors). An
// empty kind is "missing {what}", one statuses does not hold "unknown
// {what}", both unprocessable; one it maps to "", a kind the driver knows
// carries no payment fact, is irrelevant.
func LookupStatus(statuses map[string]payment.Status, what, kind string) (payment.Status, error) {
	status, ok := statuses[kind]
	switch {
	case kind == "":
		return "", Unprocessable("missing " + what)
	case !ok:
		return "", Unprocessable("unknown " + what)
	case status == "":
		return "", Irrelevant(kind + " carries no payment fact")
	}
	return status, nil
}

// Unprocessable returns an error wrapping ErrUnprocessable with a short
// reason, the way Driver.Parse reports an authentic but unusable payload.
func Unprocessable(reason string) error {
	return fmt.Errorf("%w: %s", ErrUnprocessable, reason)
}

// Unauthentic returns a *VerifyError with the given reason (one of the
// Reason constants) and detail.
func Unauthentic(reason, detail string) error {
	return &VerifyError{Reason: reason, Detail: detail}
}

// CheckTime reports whether t, a time a gateway says something happened, is
// usable: between 1970 and 9999 in UTC, so it survives JSON encoding and
// Postgres timestamptz. what names the field in the error.
func CheckTime(what string, t time.Time) error {
	if y := t.UTC().Year(); y < 1970 || y > 9999 {
		return Unprocessable(what + " out of range")
	}
	return nil
}
