package schemas

import _ "embed"

// PaymentStateAvro is the Avro schema of the state event, the value the
// sink writes with --state-format avro: the fields of
// payment-state.v1.json's contract (the payment object's four), money in
// longs, timestamps in timestamp-micros. It changes by the same rule as
// the JSON Schema: new optional fields only, each with a default, so
// BACKWARD compatibility holds on the registry.
//
//go:embed payment-state.v1.avsc
var PaymentStateAvro string

// PaymentStateAvroFile is PaymentStateAvro's file name.
const PaymentStateAvroFile = "payment-state.v1.avsc"
