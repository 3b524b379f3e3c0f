package testenv

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/paystream/paystream/internal/envelope"
	"github.com/paystream/paystream/internal/payment"
)

// StateEvent is a payment-state value as the sink publishes it, for tests
// of what reads the state topic (paystream tail, the example consumer):
// key is "acme:<payment id>", the payment's amount is 1050 BRL, and the
// event occurred at 2026-11-29 18:00:<version> UTC, recorded a second later.
func StateEvent(key string, version int64, from, to payment.Status, kind string, amount int64) envelope.State {
	at := time.Date(2026, 11, 29, 18, 0, int(version), 0, time.UTC)
	return envelope.State{
		EventID: envelope.StateEventID(key, version), PaymentKey: key, Source: "acme", PaymentID: strings.TrimPrefix(key, "acme:"),
		Version: version, Status: to, PreviousStatus: from, Kind: kind, AmountMinor: amount, Currency: "BRL",
		Payment:       payment.State{Status: to, Version: version, AmountMinor: 1050, Currency: "BRL"},
		SourceEventID: fmt.Sprintf("msg_%d", version), OccurredAt: at, RecordedAt: at.Add(time.Second),
	}
}

// StateBatch is the events of one Kafka transaction; Abort aborts it
// instead of committing, so read_committed readers must never see them.
type StateBatch struct {
	Events []envelope.State
	Abort  bool
}

// PublishStates writes each batch in one Kafka transaction, keyed by
// payment with the event-id header, as the sink does, so a reader's test
// meets the same transactions, ordering and headers as in production.
func PublishStates(t testing.TB, brokers []string, topic string, batches ...StateBatch) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(brokers...), kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(Group(t)), kgo.RecordPartitioner(kgo.StickyKeyPartitioner(nil)))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	for _, b := range batches {
		if err := cl.BeginTransaction(); err != nil {
			t.Fatal(err)
		}
		for _, ev := range b.Events {
			v, err := json.Marshal(ev)
			if err != nil {
				t.Fatal(err)
			}
			rec := &kgo.Record{Key: []byte(ev.PaymentKey), Value: v,
				Headers: []kgo.RecordHeader{{Key: envelope.HeaderEventID, Value: []byte(ev.EventID)}}}
			if err := cl.ProduceSync(t.Context(), rec).FirstErr(); err != nil {
				t.Fatal(err)
			}
		}
		if err := cl.EndTransaction(t.Context(), kgo.TransactionEndTry(!b.Abort)); err != nil {
			t.Fatal(err)
		}
	}
}
